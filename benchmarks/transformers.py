"""Benchmark section for transformers (issue 40 item 6, issue 48): BERT-, GPT-2-, DistilBERT-
and ViT-style models from Keras 3 layers (``tfsurgery.models.transformers``, random weights),
one BERT-base-size encoder, and the real libraries' models built from configs
(``benchmarks/library_transformers.py``: Hugging Face TFBertModel, TFGPT2Model, TFViTModel and
keras-hub BertBackbone; 4 layers, hidden 256, seq 128), each run every way a user could deploy
it, in one run, with the CPU named:

- TensorFlow: the frozen original and tfsurgery's optimized graph (one process);
- onnxruntime (one process, sessions not spinning when idle): tf2onnx's ONNX of the original;
  that ONNX through onnxruntime's transformer optimizer (``optimizer.optimize_model``,
  ``model_type="bert"``); tfsurgery's ONNX with no fusion, with each fusion alone
  (``fuse-layer-norm``, ``fuse-gelu``, ``fuse-attention``), with all of them, and as a user
  gets it by default (``--onnx-fusions auto``: the fusions its own timing at export keeps);
  beside the default, the recipe a user would try instead: tfsurgery ``--onnx-fusions none``
  through onnxruntime's transformer optimizer (``model_type`` the model's architecture) — the
  fused ops each wrote are counted;
  onnxruntime's ``quantize_dynamic`` (int8 MatMul weights) on tf2onnx's ONNX and on tfsurgery's
  fused ONNX; tfsurgery's own int8 — ``--quantize int8`` with every default
  (``--int8-mode auto``) through the public API (``tfsurgery.write``), on rows of other seeds
  than the rows that judge it;
- OpenVINO (one process): tfsurgery's optimized graph as IR, at f32 and at OpenVINO's default
  CPU precision (bf16 where the CPU has it);
- TFLite (one process): tfsurgery's TFLite export of the optimized graph (the interpreter's
  default delegate: XNNPACK).

Batches 1 and 4, token inputs a transformer takes (ids within the vocabulary, a padding mask
with the second half of the rows padded after three quarters). Every ONNX is compared with the
original in TensorFlow on the same inputs (max relative error). Speed only: random weights.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from benchmarks import library_transformers as library
from benchmarks.common import markdown_table
from tfsurgery import api
from tfsurgery.bench import latency
from tfsurgery.export import onnx as onnx_export
from tfsurgery.export import onnx_fusion
from tfsurgery.export import openvino as openvino_export
from tfsurgery.export import savedmodel as savedmodel_export
from tfsurgery.export import tflite as tflite_export
from tfsurgery.int8 import target as int8_target
from tfsurgery.models import transformers
from tfsurgery.verify import check as verify

VOCAB = 1000
SMALL = dict(layers=4, hidden=256, heads=4, seq=128)
MODELS = {
    "bert": ("bert", SMALL),
    "gpt2": ("gpt2", SMALL),
    "distilbert": ("distilbert", SMALL),
    "vit": ("vit", dict(layers=4, hidden=256, heads=4, seq=64, patch=16)),
    "bert-base": ("bert", dict(layers=12, hidden=768, heads=12, seq=384)),
    # the real libraries (library.BUILDERS), random weights from configs
    "hf-bert": ("hf-bert", SMALL),
    "hf-gpt2": ("hf-gpt2", SMALL),
    "hf-vit": ("hf-vit", dict(layers=4, hidden=256, heads=4, seq=64)),     # 128² px, patch 16
    "keras-hub-bert": ("keras-hub-bert", SMALL),
    # a smoke run's model (not in the default list): the whole section in a few minutes
    "hf-bert-tiny": ("hf-bert", dict(layers=2, hidden=64, heads=2, seq=32)),
}
BATCHES = (1, 4)
# BERT-base at seq 384 takes ~0.8 s a run at batch 1 on 2 cores: a quarter of the runs (at
# least 5) keeps its section near 15 minutes; its spread is in the JSON.
RUNS_DIVISOR = {"bert-base": 4}
DEFAULT = "tfsurgery default (auto)"
RECIPE = "tfsurgery none + ort optimizer"    # the recipe tfsurgery's default is held against
TIMED_ONNX = (DEFAULT, RECIPE, "tf2onnx", "tf2onnx + ort optimizer", "tfsurgery unfused",
              "tfsurgery + fuse-layer-norm", "tfsurgery + fuse-gelu",
              "tfsurgery + fuse-attention", "tfsurgery fused",
              "ort dynamic int8 (tf2onnx)", "ort dynamic int8 (tfsurgery fused)",
              "tfsurgery int8")
TFLITE = "TFLite (tfsurgery)"
# the ops a fusion writes: onnxruntime's contrib kernels and ONNX's LayerNormalization
FUSED_OPS = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization",
             "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "LayerNormalization",
             "SimplifiedLayerNormalization", "Gelu", "FastGelu", "BiasGelu", "QuickGelu")
INT8_PEER = "ort dynamic int8 (tf2onnx)"     # the recipe tfsurgery's int8 is held against
INT8_ROWS = 40              # --samples rows: 16 calibration, 8 selection, 16 gate
INT8_SEED = 100             # their seeds: 100, 101, ... (the timed and judged rows: seed 0)


def feeds_for(built, batch: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """Inputs the model takes: ids within the vocabulary, segment ids 0/1, a padding mask (the
    second half of the rows padded after 3/4 of the sequence), images standard normal."""
    r = np.random.default_rng(seed)
    feeds = {}
    for name in built.inputs:
        node = next(n for n in built.graph_def.node if n.name == name)
        shape = [batch] + [d.size for d in node.attr["shape"].shape.dim[1:]]
        if node.attr["dtype"].type == 1:                       # DT_FLOAT
            feeds[name] = r.standard_normal(shape).astype(np.float32)
        elif "mask" in name:
            valid = np.where(np.arange(batch) < (batch + 1) // 2, shape[1], 3 * shape[1] // 4)
            feeds[name] = (np.arange(shape[1])[None] < valid[:, None]).astype(np.int32)
        elif "segment" in name or "token_type" in name:
            feeds[name] = r.integers(0, 2, shape).astype(np.int32)
        else:
            feeds[name] = r.integers(0, VOCAB, shape).astype(np.int32)
    return feeds


def model_section(label: str, *, runs: int = 20, batches=BATCHES, log=print) -> dict:
    style, params = MODELS[label]
    runs = max(5, runs // RUNS_DIVISOR.get(label, 1))
    log(f"{label}: building")
    if style in library.BUILDERS:
        built = library.build(style, params)
    else:
        extra = {} if style == "vit" else {"vocab": VOCAB}
        built = transformers.frozen(style, **params, **extra)
    feeds = {b: feeds_for(built, b) for b in batches}
    log(f"{label}: optimizing")
    result = api.optimize(built.graph_def, interface=api.Interface(
        inputs=built.inputs, outputs=built.outputs, feeds=feeds[batches[0]]))
    optimized = result.graph_def
    section = {"model": label, "style": style, "params": params, "runs": runs,
               "tf_nodes": {"original": len(built.graph_def.node),
                            "optimized": len(optimized.node)}, "batches": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "original.pb").write_bytes(built.graph_def.SerializeToString())
        (work / "optimized.pb").write_bytes(optimized.SerializeToString())
        log(f"{label}: ONNX variants")
        onnx_paths, notes = _onnx_variants(built, optimized, dict(params, style=style),
                                           feeds[batches[0]], work)
        log(f"{label}: tfsurgery int8 (--quantize int8, defaults)")
        _int8_variant(built, result, work, onnx_paths, notes)
        section["onnx"] = notes
        ir = _openvino_ir(built, optimized, feeds[batches[0]], work, notes)
        log(f"{label}: TFLite")
        tflite = _tflite(built, optimized, feeds[batches[0]], work, notes)
        for batch in batches:
            log(f"{label}: timing batch {batch}")
            section["batches"][batch] = _timed(built, feeds[batch], onnx_paths, ir, tflite,
                                               work, runs, batch)
            section["batches"][batch]["errors"] = _errors(built, feeds[batch], onnx_paths)
    return section


def _onnx_variants(built, optimized, params, feeds, work: Path):
    """Every ONNX variant written to ``work``; notes: node counts, fused ops, failures."""
    paths: Dict[str, Path] = {}
    notes: Dict[str, dict] = {}

    def attempt(name, make):
        path = work / f"{len(paths)}.onnx"
        try:
            note = make(path) or {}
        except Exception as error:      # noqa: BLE001 - any failure is reported in its row
            notes[name] = {"failed": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
            return
        paths[name] = path
        notes[name] = dict(note, nodes=_node_count(path), fused_ops=_fused_ops(path))

    attempt("tf2onnx", lambda p: _tf2onnx(built, p))
    attempt("tf2onnx + ort optimizer",
            lambda p: _ort_optimizer(paths.get("tf2onnx"), p, params))
    for name, fuse in (("tfsurgery unfused", False),
                       *[(f"tfsurgery + {n}", [n]) for n in onnx_fusion.NAMES],
                       ("tfsurgery fused", True), (DEFAULT, "auto")):
        attempt(name, lambda p, fuse=fuse: _tfsurgery(built, optimized, feeds, p, fuse))
    attempt(RECIPE, lambda p: _ort_optimizer(paths.get("tfsurgery unfused"), p, params))
    attempt("ort dynamic int8 (tf2onnx)",
            lambda p: _quantize_dynamic(paths.get("tf2onnx"), p))
    attempt("ort dynamic int8 (tfsurgery fused)",
            lambda p: _quantize_dynamic(paths.get("tfsurgery fused"), p))
    return paths, notes


def _int8_variant(built, result, work: Path, paths: Dict[str, Path], notes: Dict[str, dict]):
    """tfsurgery's own int8 of the model as ``export --quantize int8`` writes it, every
    default (modes auto, int8 refused when not faster than float): the mode it chose, or why
    it refused. Its rows come from ``feeds_for`` with seeds INT8_SEED, ... — the rows that
    choose are not the rows that judge (seed 0, the timed and compared ones)."""
    import tfsurgery
    rows = [feeds_for(built, 4, seed=INT8_SEED + i) for i in range(INT8_ROWS // 4)]
    samples, path = work / "int8_rows.npz", work / "tfsurgery_int8.onnx"
    np.savez(samples, **{name: np.concatenate([r[name] for r in rows]) for name in built.inputs})
    try:
        report = tfsurgery.write(built.graph_def, result, tfsurgery.Targets(
            onnx=path, int8=tfsurgery.Int8Targets(samples=samples))).int8
    except Exception as error:      # noqa: BLE001 - refused or failed: said in its row
        notes["tfsurgery int8"] = {"failed": f"{type(error).__name__}: "
                                             f"{str(error).splitlines()[0]}"}
        return
    paths["tfsurgery int8"] = path
    notes["tfsurgery int8"] = {
        "mode": report.mode, "modes": report.modes_line(), "rows": INT8_ROWS,
        "speedup_vs_float": report.speed.get("speedup"), "nodes": _node_count(path)}


def _tf2onnx(built, path: Path) -> dict:
    """What a user gets from tf2onnx alone on the frozen original (its own optimizers on)."""
    model, storage = onnx_export.convert(built.graph_def, built.inputs, built.outputs,
                                         opset=onnx_export.DEFAULT_OPSET)
    onnx_export.save(model, storage, path)
    return {}


def ort_model_type(style: str) -> str:
    """What onnxruntime's transformer optimizer is told the model is: its architecture."""
    return library.ORT_MODEL_TYPES.get(style) or {"gpt2": "gpt2", "vit": "vit"}.get(style, "bert")


def _ort_optimizer(source: Optional[Path], path: Path, params) -> dict:
    from onnxruntime.transformers import optimizer
    if source is None:
        raise RuntimeError("no source model")
    model_type = ort_model_type(params.get("style", "bert"))
    try:
        optimized = optimizer.optimize_model(str(source), model_type=model_type,
                                             num_heads=params["heads"],
                                             hidden_size=params["hidden"])
        level = "default"
    except ImportError:      # its default level wants torch: the python fusions alone
        optimized = optimizer.optimize_model(str(source), model_type=model_type,
                                             num_heads=params["heads"],
                                             hidden_size=params["hidden"], opt_level=0)
        level = "0 (torch missing)"
    optimized.save_model_to_file(str(path))
    return {"opt_level": level, "model_type": model_type,
            "fused": optimized.get_fused_operator_statistics()}


def _tfsurgery(built, optimized, feeds, path: Path, fuse) -> dict:
    exported = onnx_export.export(optimized, built.inputs, built.outputs, path, feeds=feeds,
                                  fuse=fuse)
    if not exported.passed:
        raise RuntimeError(f"failed its check: max error {exported.max_error:.3g}")
    return {"fused": exported.tidied, "not_fused": exported.not_fused,
            "check_max_error": exported.max_error, "choice": exported.fusion_choice,
            "choice_lines": exported.fusion_lines}


def _quantize_dynamic(source: Optional[Path], path: Path) -> dict:
    """onnxruntime's recipe for transformers on CPU: int8 MatMul weights, activations
    quantized at run time (reduce_range where the CPU has no VNNI, its guidance)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    if source is None:
        raise RuntimeError("no float model")
    reduce_range = int8_target.settings().reduce_range
    # onnx's shape inference gives no type to com.microsoft ops' outputs: say they are float
    quantize_dynamic(str(source), str(path), weight_type=QuantType.QInt8,
                     reduce_range=reduce_range,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return {"reduce_range": reduce_range}


def _tflite(built, optimized, feeds, work: Path, notes) -> Optional[Path]:
    """tfsurgery's TFLite export of the optimized graph, checked against TF on ``feeds``."""
    path = work / "model.tflite"
    try:
        artefact = tflite_export.export(
            optimized, savedmodel_export.Signature.of_graph(built.inputs, built.outputs), path,
            feeds=feeds, tolerance=verify.DEFAULT_TOLERANCE)
    except Exception as error:       # noqa: BLE001 - reported as the row's note
        notes[TFLITE] = {"failed": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
        return None
    if not artefact.passed:
        notes[TFLITE] = {"failed": f"failed its check: max error {artefact.max_error:.3g}"}
        return None
    notes[TFLITE] = {"check_max_error": artefact.max_error}
    return path


def _openvino_ir(built, optimized, feeds, work: Path, notes) -> Optional[Path]:
    if not openvino_export.installed():
        notes["openvino"] = {"failed": "OpenVINO is not installed"}
        return None
    directory = work / "openvino"
    try:
        openvino_export.save(openvino_export.convert(optimized, built.inputs, built.outputs),
                             directory)
    except Exception as error:       # noqa: BLE001 - reported as the row's note
        notes["openvino"] = {"failed": str(error).splitlines()[0]}
        return None
    notes["openvino"] = {"default_precision": openvino_export.default_precision()}
    return directory


def _timed(built, feeds, onnx_paths, ir, tflite, work: Path, runs: int, batch: int) -> dict:
    np.savez(work / f"feeds{batch}.npz", **feeds)
    npz = work / f"feeds{batch}.npz"
    rows = latency.measure_in_subprocess(
        "tensorflow", {"TF original": (work / "original.pb", npz),
                       "TF optimized": (work / "optimized.pb", npz)},
        built.outputs, runs=runs, work=work, timeout=3600)
    rows += latency.measure_in_subprocess(
        "onnxruntime", {name: (path, npz) for name, path in onnx_paths.items()},
        built.outputs, runs=runs, work=work, timeout=3600, ort_spinning=False)
    if ir is not None:
        rows += latency.measure_in_subprocess(
            "openvino", {"OpenVINO f32": (ir, npz), "OpenVINO default": (ir, npz)},
            built.outputs, runs=runs, work=work, timeout=3600,
            precisions={"OpenVINO f32": "f32", "OpenVINO default": None})
    if tflite is not None:
        rows += latency.measure_in_subprocess("tflite", {TFLITE: (tflite, npz)}, built.outputs,
                                              runs=runs, work=work, timeout=3600)
    return {"median_ms": {r.variant: r.median_ms for r in rows},
            "spread_ms": {r.variant: r.spread_ms for r in rows}}


def _errors(built, feeds, onnx_paths) -> Dict[str, float]:
    """Each ONNX's max relative error against the original in TensorFlow on these inputs."""
    expected = verify.run_graph(built.graph_def, dict(feeds), list(built.outputs),
                                timeout=600, label="the original")
    errors = {}
    for name, path in onnx_paths.items():
        actual = onnx_export.run_onnx(str(path), {f"{k}:0": v for k, v in feeds.items()},
                                      built.outputs, timeout=600)
        errors[name] = verify.worst_error([verify.output_error(o, e, a) for o, e, a in
                                           zip(built.outputs, expected, actual)])
    return errors


def _fused_ops(path: Path) -> Dict[str, int]:
    """The fused ops in the ONNX model at ``path``, by type."""
    import onnx
    counts: Dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        if node.op_type in FUSED_OPS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _node_count(path: Path) -> int:
    import onnx
    return len(onnx.load(str(path), load_external_data=False).graph.node)


def run(models: List[str], *, runs: int = 20, log=print) -> dict:
    from benchmarks.measure import machine_info
    return {"machine": machine_info(), "int8_cpu": int8_target.cpu_name(),
            "models": [model_section(m, runs=runs, log=log) for m in models]}


def render(result: dict) -> str:
    machine = result["machine"]
    lines = ["## Transformers", "",
             f"`python scripts/benchmark.py --transformers` — {machine['cpu']}, "
             f"{machine['cores']} cores, {machine['date']}, load average at start "
             f"{' / '.join(map(str, machine['load_average_at_start']))}. The machine is shared "
             "with other jobs: medians of interleaved runs, each runtime in its own process; "
             "differences under ~20% are within this machine's noise. Random weights: speed "
             "only. Error: max relative error against the original in TensorFlow.", ""]
    for section in result["models"]:
        lines += _render_model(section)
    return "\n".join(lines) + "\n"


def _render_model(section: dict) -> List[str]:
    p = section["params"]
    batches = sorted(section["batches"])
    lines = [f"### {section['model']} ({p['layers']} layers, hidden {p['hidden']}, "
             f"{p['heads']} heads, seq {p['seq']}; medians of {section['runs']} runs)", ""]
    names = ["TF original", "TF optimized", *TIMED_ONNX, "OpenVINO f32", "OpenVINO default",
             TFLITE]
    base = "tf2onnx"
    rows = []
    for name in names:
        note = section["onnx"].get(name, {})
        timed = [section["batches"][b]["median_ms"].get(name) for b in batches]
        if all(t is None for t in timed):
            why = note.get("failed") or (section["onnx"].get("openvino", {}).get("failed")
                                         if name.startswith("OpenVINO") else "") or "not timed"
            rows.append([name, "—", *(["—"] * (2 * len(batches))), "—", why[:90]])
            continue
        cells = []
        for b, t in zip(batches, timed):
            ref = section["batches"][b]["median_ms"].get(base)
            cells += [f"{t:.2f}", f"{ref / t:.2f}×" if ref and t else "—"]
        error = section["batches"][batches[0]].get("errors", {}).get(
            name, note.get("check_max_error"))          # TFLite: its export's check
        rows.append([name, note.get("nodes", "—"), *cells,
                     f"{error:.1e}" if error is not None else "—", _fused_note(note)])
    header = ["variant", "ONNX nodes"]
    for b in batches:
        header += [f"batch {b} ms", f"vs tf2onnx b{b}"]
    lines.append(markdown_table(header + ["error", "fused"], rows, "l" + "r" * (len(header) - 1)
                                + "rl"))
    lines += ["", f"TF nodes: {section['tf_nodes']['original']} original, "
              f"{section['tf_nodes']['optimized']} optimized.", "", _recipe_line(section), "",
              _int8_line(section), ""]
    return lines


def _recipe_line(section: dict) -> str:
    """tfsurgery's default against the recipe a user would try instead (same onnxruntime
    process, each batch), and the fused ops each wrote."""
    batches = sorted(section["batches"])
    ratios = []
    for b in batches:
        ms = section["batches"][b]["median_ms"]
        ours, peer = ms.get(DEFAULT), ms.get(RECIPE)
        ratios.append(f"batch {b} {peer / ours:.2f}×" if ours and peer else f"batch {b} —")

    def fused(name):
        note = section["onnx"].get(name, {})
        if "fused_ops" not in note:
            return note.get("failed", "not run")
        return ", ".join(f"{n} {op}" for op, n in sorted(note["fused_ops"].items())) or "none"
    return (f"tfsurgery default vs `{RECIPE}` (its ms / ours): {', '.join(ratios)}. Fused ops — "
            f"tfsurgery default: {fused(DEFAULT)}; tfsurgery fused (all): "
            f"{fused('tfsurgery fused')}; the recipe: {fused(RECIPE)}.")


def _int8_line(section: dict) -> str:
    """tfsurgery's int8: the mode chosen, its speed against the recipe (same onnxruntime
    process, each batch) and both errors on the judged rows — or why there is none."""
    note = section["onnx"].get("tfsurgery int8", {})
    if "mode" not in note:
        return f"tfsurgery int8: none — {note.get('failed', 'not run')}"
    batches = sorted(section["batches"])
    ratios = []
    for b in batches:
        ms = section["batches"][b]["median_ms"]
        ours, peer = ms.get("tfsurgery int8"), ms.get(INT8_PEER)
        ratios.append(f"batch {b} {peer / ours:.2f}×" if ours and peer else f"batch {b} —")
    errors = section["batches"][batches[0]].get("errors", {})
    ours, peer = errors.get("tfsurgery int8"), errors.get(INT8_PEER)
    error = (f"error {ours:.2e} against the recipe's {peer:.2e}" if ours is not None and
             peer is not None else "error —")
    return (f"tfsurgery int8 (`--quantize int8`, every default, {note['rows']} rows of other "
            f"seeds): wrote **{note['mode']}**; speed vs `{INT8_PEER}` (its ms / ours): "
            f"{', '.join(ratios)}; {error}. Modes it measured on its selection rows: "
            f"{note['modes']}.")


def _fused_note(note: dict) -> str:
    if "mode" in note:                  # tfsurgery's int8: the mode it wrote
        return f"int8 mode: {note['mode']}"
    choice = note.get("choice")
    if choice:
        return (f"kept by its timing at export: {', '.join(choice['kept']) or 'none'}"
                + (f"; dropped: {', '.join(choice['dropped'])}" if choice["dropped"] else ""))
    fused = note.get("fused") or {}
    text = ", ".join(f"{n} {what}" for what, n in fused.items() if n)
    return text[:120]
