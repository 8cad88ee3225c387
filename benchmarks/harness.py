"""Benchmark: tfsurgery against its peers on the same graphs, in one run.

For each model, four variants side by side — the original, TensorFlow's
``optimize_for_inference_lib``, offline Grappler (constant folding + arithmetic through
``tf_optimizer``) and tfsurgery (``--bn-fold``) — with: TF node count, ops that should be gone
(see ``leftover_ops``), max output error against the original, optimization time, and the ONNX
node count after tf2onnx (raw, and after onnxruntime's basic rewrites as ``tfsurgery export``
does). The floor is the time protobuf takes to parse and serialize the same graph. A synthetic
scaling run times the pipeline on the same conv/BN block repeated to 2k, 20k and 200k nodes.

``scripts/benchmark.py`` is the command line; ``run`` returns everything as one JSON-able dict and
``render_markdown`` turns it into ``docs/benchmark.md``.
"""
from __future__ import annotations

import collections
import datetime
import os
import platform
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from benchmarks.common import markdown_table, source_of  # noqa: F401
from tfsurgery import api, onnx_export, onnx_tidy, pipeline, verify
from tfsurgery.contract import Options
from tfsurgery.constants import constant_nodes
from tfsurgery.ops import FUSED_BATCH_NORM_OPS, first_line

MODELS = ("article_cnn", "tf_keras", "MobileNetV2", "ResNet50", "EfficientNetB0")
QUICK_MODELS = ("article_cnn", "tf_keras")
VARIANTS = ("original", "optimize_for_inference", "grappler", "tfsurgery")
SCALING_BLOCKS = (200, 2000, 20000)       # ~10 nodes per block: 2k, 20k, 200k nodes
QUICK_SCALING_BLOCKS = (200, 2000)
TOLERANCE = 1e-4
GRAPPLER_OPTIMIZERS = ("constfold", "arithmetic")
FLAT_RATIO = 1.5      # "time per node stays flat": slowest / fastest µs per node at most this

# What "left over" means (documented in the Markdown).
COND_DROPOUT = ("Switch", "Merge", "RandomUniform")
LINEAR = ("Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul", "BatchMatMulV2",
          "BatchMatMulV3", "Conv2DBackpropInput", "Conv3DBackpropInputV2")
ADDITIVE = ("BiasAdd", "Add", "AddV2", "Sub")
AFFINE = ADDITIVE + ("Mul",)
PASS_THROUGH = ("BatchToSpaceND", "Identity")      # layout/no-op links a chain may cross


# ---------------------------------------------------------------- models
def build_model(name: str, input_size: Optional[int] = None):
    """A BuiltModel by benchmark name."""
    from tfsurgery.models import keras_models, tf1
    if name == "article_cnn":
        return tf1.article_cnn()
    if name == "tf_keras":
        return keras_models.tf_keras_model()
    return keras_models.keras_application(name, input_size=input_size)


# ---------------------------------------------------------------- the four variants
def run_optimize_for_inference(built):
    from tensorflow.python.tools import optimize_for_inference_lib
    from tfsurgery.graph import Graph
    graph = Graph(built.graph_def, check_inputs=False)
    dtypes = [graph.node(name).attr["dtype"].type for name in built.inputs]
    return optimize_for_inference_lib.optimize_for_inference(
        built.graph_def, list(built.inputs), list(built.outputs),
        dtypes[0] if len(dtypes) == 1 else dtypes)


def grappler_meta_graph(built):
    """The GraphDef as a MetaGraph whose `train_op` collection names the outputs (Grappler keeps
    fetch nodes, and prunes everything else)."""
    import tensorflow as tf
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(built.graph_def, name="")
        for name in built.outputs:
            graph.add_to_collection("train_op", graph.get_operation_by_name(name))
        return tf.compat.v1.train.export_meta_graph(graph=graph)


def grappler_config(optimizers: Sequence[str] = GRAPPLER_OPTIMIZERS):
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.extend(optimizers)
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    return config


def run_grappler(meta_graph, config):
    from tensorflow.python.grappler import tf_optimizer
    return tf_optimizer.OptimizeGraph(config, meta_graph, verbose=False,
                                      graph_id=b"tfsurgery_benchmark")


def run_tfsurgery(built) -> api.Result:
    source = source_of(built)
    return api.optimize(source, api.choose_transforms(bn_fold=True),
                        checks=api.Checks(verify=False))


def parse_and_serialize(data: bytes) -> None:
    from tensorflow.core.framework import graph_pb2
    graph_pb2.GraphDef.FromString(data).SerializeToString()


def time_interleaved(functions: Dict[str, Callable], repeats: int) -> Dict[str, dict]:
    """Run each function ``repeats`` times, interleaved; its last result (or error) and the
    median wall time. A function that raises is not retried."""
    out = {name: {"result": None, "error": None, "times": []} for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            entry = out[name]
            if entry["error"]:
                continue
            start = time.perf_counter()
            try:
                entry["result"] = fn()
            except Exception as error:   # a peer failing on a graph is a result, not a crash
                entry["error"] = first_line(error)
                continue
            entry["times"].append(time.perf_counter() - start)
    for entry in out.values():
        entry["seconds"] = statistics.median(entry["times"]) if entry["times"] else None
    return out


# ---------------------------------------------------------------- measurements
def extra_affine_ops(graph, constant: set) -> int:
    """Per conv/matmul: the chain of Mul/Add/AddV2/Sub/BiasAdd with a constant other operand,
    each the only reader of the one before (BatchToSpaceND/Identity may sit in between). Every op
    of the chain counts except one additive op — the bias a folded BN leaves."""
    extra = 0
    for node in graph:
        if node.op not in LINEAR:
            continue
        chain, current = [], node.name
        while True:
            readers = graph.consumer_nodes(current)
            if len(readers) != 1:
                break
            (reader,) = readers
            op = graph.op(reader)
            others = [r for r in graph.inputs(reader) if r.node != current]
            if op not in AFFINE + PASS_THROUGH or not all(r.node in constant for r in others):
                break
            if op in AFFINE:
                chain.append(op)
            current = reader
        extra += len(chain) - (1 if any(op in ADDITIVE for op in chain) else 0)
    return extra


def leftover_ops(graph_def) -> Dict[str, int]:
    """Ops an inference graph should not have: BN (FusedBatchNorm*, Rsqrt, affine ops after a
    conv/matmul beyond its one bias) and training-time control flow / dropout."""
    from tfsurgery.graph import Graph
    graph = Graph(graph_def, check_inputs=False)
    hist = graph.op_histogram()
    counts = {"FusedBatchNorm*": sum(hist.get(op, 0) for op in FUSED_BATCH_NORM_OPS),
              "Rsqrt": hist.get("Rsqrt", 0),
              "extra affine": extra_affine_ops(graph, constant_nodes(graph))}
    counts.update({op: hist.get(op, 0) for op in COND_DROPOUT})
    counts["bn_total"] = counts["FusedBatchNorm*"] + counts["Rsqrt"] + counts["extra affine"]
    counts["cond_dropout_total"] = sum(counts[op] for op in COND_DROPOUT)
    return counts


def max_error(graph_def, built, feeds, reference) -> float:
    """Max relative output error against the original's outputs (training flags fed False)."""
    present = {n.name for n in graph_def.node}
    run_feeds = {k: v for k, v in feeds.items() if k.split(":")[0] in present}
    actual = verify.run_graph(graph_def, run_feeds, built.outputs)
    return max(verify.output_error(name, e, a).max_rel
               for name, e, a in zip(built.outputs, reference, actual))


def onnx_counts(graph_def, inputs, outputs, opset: int, tidy: bool = False) -> dict:
    """ONNX node counts: straight out of tf2onnx, and after onnxruntime's basic rewrites (with
    ``tidy``, after ``onnx_tidy`` too: the model ``--onnx`` writes)."""
    try:
        model, storage = onnx_export.convert(graph_def, inputs, outputs, opset=opset)
    except onnx_export.ExportError as error:
        return {"error": str(error)}
    raw = collections.Counter(node.op_type for node in model.graph.node)
    result = {"nodes": sum(raw.values()), "if": raw.get("If", 0), "histogram": dict(raw)}
    if tidy:
        result["tidied"] = onnx_tidy.tidy(model)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        try:
            onnx_export.save(model, storage, path)
            onnx_export.optimize_with_onnxruntime(path)
            basic = onnx_export.op_histogram(path)
            result.update(ort_basic_nodes=sum(basic.values()), ort_basic_histogram=basic)
        except Exception as error:   # onnxruntime rejecting the model is a result too
            result["ort_basic_error"] = first_line(error)
    return result


def measure_variant(graph_def, built, feeds, reference, opset: int, tidy: bool = False) -> dict:
    row = {"nodes": len(graph_def.node), "leftover": leftover_ops(graph_def)}
    try:
        row["max_error"] = max_error(graph_def, built, feeds, reference)
    except verify.VerificationError as error:
        row["max_error"] = None
        row["run_error"] = str(error)
    row["onnx"] = onnx_counts(graph_def, built.inputs, built.outputs, opset, tidy)
    return row


def benchmark_model(name: str, built, *, repeats: int = 3, opset: int = onnx_export.DEFAULT_OPSET,
                    grappler_optimizers: Sequence[str] = GRAPPLER_OPTIMIZERS,
                    seed: int = 0, deploy_runs: int = 0) -> dict:
    """All four variants of one model: structure, error, time, ONNX; plus the parse floor."""
    data = built.graph_def.SerializeToString()
    meta_graph, config = grappler_meta_graph(built), grappler_config(grappler_optimizers)
    timed = time_interleaved({
        "floor": lambda: parse_and_serialize(data),
        "optimize_for_inference": lambda: run_optimize_for_inference(built),
        "grappler": lambda: run_grappler(meta_graph, config),
        "tfsurgery": lambda: run_tfsurgery(built),
    }, repeats)
    ours = timed["tfsurgery"]["result"]
    if ours is not None:
        timed["tfsurgery"]["result"] = ours.graph_def
    graphs = {"original": built.graph_def}
    graphs.update({k: timed[k]["result"] for k in VARIANTS[1:] if timed[k]["result"] is not None})

    feeds = verify.make_feeds(built.graph_def, built.inputs, seed)
    if built.training_flag:
        feeds[built.training_flag] = np.bool_(False)
    reference = verify.run_graph(built.graph_def, feeds, built.outputs)
    rows = {}
    for variant in VARIANTS:
        if variant in graphs:
            rows[variant] = measure_variant(graphs[variant], built, feeds, reference, opset,
                                            tidy=variant == "tfsurgery")
        else:
            rows[variant] = {"error": timed[variant]["error"]}
        rows[variant]["seconds"] = timed[variant]["seconds"] if variant in timed else None
    if ours is not None:     # where tfsurgery's time goes (last repeat)
        rows["tfsurgery"]["transform_seconds"] = {r.name: r.seconds for r in ours.reports}
    row = {"model": name, "graph_bytes": len(data), "floor_seconds": timed["floor"]["seconds"],
           "variants": rows, "ratios": time_ratios(rows, timed["floor"]["seconds"])}
    if deploy_runs:         # artefact sizes (pb, SavedModel, ONNX, TFLite) and runtime latency
        from benchmarks import deploy
        row["deployment"] = deploy.deployment(built, runs=deploy_runs)
    return row


def time_ratios(rows: dict, floor: float) -> dict:
    ours = rows["tfsurgery"].get("seconds")
    grappler = rows["grappler"].get("seconds")
    return {"tfsurgery_over_grappler": ours / grappler if ours and grappler else None,
            "tfsurgery_over_floor": ours / floor if ours and floor else None}


# ---------------------------------------------------------------- scaling
def scaling_run(blocks: Sequence[int] = SCALING_BLOCKS, repeats: int = 3) -> List[dict]:
    """Pipeline time (all transforms incl. fold-batch-norm, no verification) per graph size,
    with the parse+serialize floor of the same graph: medians of ``repeats`` interleaved runs."""
    from tfsurgery.models.synthetic import repeated_blocks
    transforms = api.choose_transforms(bn_fold=True)
    rows = []
    for n in blocks:
        built = repeated_blocks(n)
        options = Options(inputs=list(built.inputs), outputs=list(built.outputs))
        data = built.graph_def.SerializeToString()
        timed = time_interleaved({
            "floor": lambda: parse_and_serialize(data),
            "pipeline": lambda: len(pipeline.run(built.graph_def, transforms, options)[0].node),
        }, repeats)
        seconds, floor = timed["pipeline"]["seconds"], timed["floor"]["seconds"]
        nodes = len(built.graph_def.node)
        runs = timed["pipeline"]["times"]
        rows.append({"blocks": n, "nodes": nodes, "nodes_after": timed["pipeline"]["result"],
                     "seconds": seconds, "seconds_range": [min(runs), max(runs)],
                     "us_per_node": seconds / nodes * 1e6,
                     "floor_seconds": floor, "floor_us_per_node": floor / nodes * 1e6})
    return rows


# ---------------------------------------------------------------- training ops (ONNX training export)
def training_ops_section(repeats: int = 10) -> dict:
    """`benchmarks.training.adam_step_benchmark` if it exists, else why not."""
    try:
        from benchmarks.training import adam_step_benchmark
    except ImportError as error:
        return {"error": f"benchmarks.training.adam_step_benchmark is not available "
                         f"({first_line(error)})"}
    try:
        return adam_step_benchmark(repeats=repeats)
    except Exception as error:   # someone else's module, still changing: report, do not crash
        return {"error": f"adam_step_benchmark failed: {type(error).__name__}: "
                         f"{first_line(error)}"}


# ---------------------------------------------------------------- machine and targets
def machine_info() -> dict:
    import onnxruntime
    import tensorflow as tf
    import tf2onnx

    def first(path, key):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return None

    mem_kb = first("/proc/meminfo", "MemTotal")
    return {"cpu": first("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
            "cores": os.cpu_count(),
            "ram_gib": round(int(mem_kb.split()[0]) / 2 ** 20, 1) if mem_kb else None,
            "os": platform.platform(), "python": platform.python_version(),
            "tensorflow": tf.__version__, "tf2onnx": tf2onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


# the simplification goal: fewer TF nodes than Grappler on every model, these counts at most
LEAN_TF_NODES = {"EfficientNetB0": 560, "ResNet50": 285, "MobileNetV2": 262}
LEAN_ONNX_NODES = {"EfficientNetB0": 235}           # after onnxruntime's basic rewrites
FLOOR_RATIO = 15                                    # scaling: pipeline time per node vs the floor


def _lean_graph_targets(models: dict, add) -> None:
    for name, variants in ((n, m.get("variants", {})) for n, m in models.items()):
        ours, grappler = variants.get("tfsurgery", {}), variants.get("grappler", {})
        if "nodes" in ours and "nodes" in grappler:
            add(f"{name}: fewer TF nodes than Grappler ({grappler['nodes']})", ours["nodes"],
                ours["nodes"] < grappler["nodes"])
        if name in LEAN_TF_NODES and "nodes" in ours:
            add(f"{name}: ≤ {LEAN_TF_NODES[name]} TF nodes", ours["nodes"],
                ours["nodes"] <= LEAN_TF_NODES[name])
        if name in LEAN_ONNX_NODES and "onnx" in ours:
            exported = ours["onnx"].get("ort_basic_nodes")
            ops = histogram_text(ours["onnx"].get("ort_basic_histogram", {}))
            add(f"{name}: ≤ {LEAN_ONNX_NODES[name]} ONNX nodes after onnxruntime's basic "
                "rewrites", f"{exported} ({ops})" if exported is not None else "error",
                exported is not None and exported <= LEAN_ONNX_NODES[name])


def check_targets(result: dict) -> List[dict]:
    """The issues' targets, each with the measured value and whether it is met."""
    models = {m["model"]: m for m in result["models"]}
    checks = []

    def add(target, value, met):
        checks.append({"target": target, "value": value, "met": bool(met)})

    for name in ("tf_keras", "MobileNetV2", "ResNet50", "EfficientNetB0", "article_cnn"):
        row = models.get(name, {}).get("variants", {}).get("tfsurgery")
        if not row or "leftover" not in row:
            continue
        left = row["leftover"]
        add(f"{name}: 0 BN ops left (FusedBatchNorm*, Rsqrt, extra affine)",
            left["bn_total"], left["bn_total"] == 0)
        add(f"{name}: 0 Switch/Merge/RandomUniform left", left["cond_dropout_total"],
            left["cond_dropout_total"] == 0)
        err = row.get("max_error")
        add(f"{name}: outputs within {TOLERANCE:g} relative", fmt_error(err),
            err is not None and err <= TOLERANCE)

    for name, tf_max, onnx_max in (("ResNet50", 300, 130), ("MobileNetV2", 275, 110)):
        row = models.get(name, {}).get("variants", {}).get("tfsurgery")
        if not row or "nodes" not in row:
            continue
        onnx = row["onnx"]
        add(f"{name}: ≤ {tf_max} TF nodes", row["nodes"], row["nodes"] <= tf_max)
        add(f"{name}: ≤ {onnx_max} ONNX nodes after tf2onnx",
            f"{onnx.get('nodes', 'error')} (after ORT basic: {onnx.get('ort_basic_nodes', '-')})",
            onnx.get("nodes", onnx_max + 1) <= onnx_max)

    _lean_graph_targets(models, add)
    resnet = models.get("ResNet50")
    if resnet:
        ratios = resnet["ratios"]
        for key, limit, text in (("tfsurgery_over_grappler", 1 / 3, "≤ 1/3 of Grappler's time"),
                                 ("tfsurgery_over_floor", 3, "≤ 3× parse+serialize time")):
            value = ratios.get(key)
            add(f"ResNet50: tfsurgery {text}", fmt_ratio(value),
                value is not None and value <= limit)

    article = models.get("article_cnn", {}).get("variants", {}).get("tfsurgery")
    if article and "onnx" in article:
        onnx = article["onnx"]
        exported = onnx.get("ort_basic_nodes", onnx.get("nodes"))
        add("article_cnn: exports with no If and ≤ 14 ONNX nodes (as `tfsurgery export`: "
            "tf2onnx + ORT basic)",
            f"{exported} nodes, {onnx.get('if', '?')} If (raw tf2onnx: {onnx.get('nodes')})",
            exported is not None and exported <= 14 and onnx.get("if") == 0)

    scaling = result.get("scaling") or []
    if scaling:
        largest = scaling[-1]
        ratio = largest["us_per_node"] / largest["floor_us_per_node"]
        add(f"scaling: {largest['nodes']} nodes at ≤ {FLOOR_RATIO}× the parse+serialize time per "
            f"node", f"{ratio:.1f}×", ratio <= FLOOR_RATIO)
    if len(scaling) >= 2:
        per_node = [r["us_per_node"] for r in scaling]
        spread = max(per_node) / min(per_node)
        add(f"scaling: time per node flat from {scaling[0]['nodes']} to {scaling[-1]['nodes']} "
            f"nodes (slowest/fastest µs per node ≤ {FLAT_RATIO})", f"{spread:.2f}×",
            spread <= FLAT_RATIO)
    return checks


# ---------------------------------------------------------------- the whole run
def run(models: Sequence[str] = MODELS, *, repeats: int = 3, input_size: Optional[int] = None,
        opset: int = onnx_export.DEFAULT_OPSET, scaling_blocks: Sequence[int] = SCALING_BLOCKS,
        grappler_optimizers: Sequence[str] = GRAPPLER_OPTIMIZERS, training_ops: bool = False,
        training_repeats: int = 10, deploy_runs: int = 20,
        log: Callable[[str], None] = lambda _: None) -> dict:
    result = {"machine": machine_info(),
              "settings": {"repeats": repeats, "input_size": input_size or 32, "opset": opset,
                           "grappler_optimizers": list(grappler_optimizers),
                           "tolerance": TOLERANCE},
              "models": [], "scaling": [], "training_ops": None}
    for name in models:
        log(f"building {name}")
        built = build_model(name, input_size)
        log(f"benchmarking {name} ({len(built.graph_def.node)} nodes)")
        result["models"].append(benchmark_model(name, built, repeats=repeats, opset=opset,
                                                grappler_optimizers=grappler_optimizers,
                                                deploy_runs=deploy_runs))
    if scaling_blocks:
        log(f"scaling run: {', '.join(map(str, scaling_blocks))} blocks")
        result["scaling"] = scaling_run(scaling_blocks, repeats)
    if training_ops:
        log("training ops: adam_step_benchmark")
        result["training_ops"] = training_ops_section(training_repeats)
    result["targets"] = check_targets(result)
    return result


# ---------------------------------------------------------------- Markdown
LEFTOVER_DEFINITION = """\
**Left over** counts ops an inference graph should not have.
*BN*: FusedBatchNorm/V2/V3 + Rsqrt + *extra affine* ops. Extra affine: after each
Conv2D/Conv3D/DepthwiseConv2dNative/MatMul/BatchMatMul/transposed conv, follow the chain of
Mul/Add/AddV2/Sub/BiasAdd ops whose other operand is constant-valued (Const, or computed only from
Consts, e.g. the Rsqrt of a frozen variance), each the only reader of the one before
(BatchToSpaceND and Identity may sit in between and are not counted); every op of that chain
counts except one additive op, the bias a folded BN leaves. A residual Add (non-constant operand)
ends the chain and is not counted. *cond/dropout*: Switch + Merge + RandomUniform."""


def fmt_seconds(value) -> str:
    if value is None:
        return "–"
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


def fmt_ratio(value) -> str:
    return "–" if value is None else f"{value:.2f}×"


def fmt_error(value) -> str:
    return "–" if value is None else f"{value:.1e}"


def fmt_onnx(onnx: dict) -> List[str]:
    if "error" in onnx:
        return ["error", "–", "–"]
    return [str(onnx["nodes"]), str(onnx.get("ort_basic_nodes", "error")), str(onnx["if"])]


def model_rows(model: dict) -> List[list]:
    rows = []
    for variant in VARIANTS:
        row = model["variants"][variant]
        if "nodes" not in row:
            rows.append([variant, f"error: {row.get('error', '?')}"] + ["–"] * 8)
            continue
        left = row["leftover"]
        seconds = "–" if variant == "original" else fmt_seconds(row["seconds"])
        rows.append([variant, row["nodes"], left["bn_total"], left["cond_dropout_total"],
                     fmt_error(row["max_error"]) if variant != "original" else "–", seconds,
                     *fmt_onnx(row["onnx"])])
    return rows


def render_model(model: dict) -> str:
    header = ["variant", "TF nodes", "BN left", "cond/dropout left", "max error", "opt. time",
              "ONNX (tf2onnx)", "ONNX (+ORT basic)", "ONNX If"]
    ratios = model["ratios"]
    notes = [f"parse+serialize floor: {fmt_seconds(model['floor_seconds'])} "
             f"({model['graph_bytes'] / 2 ** 20:.1f} MiB); tfsurgery / Grappler: "
             f"{fmt_ratio(ratios['tfsurgery_over_grappler'])}; tfsurgery / floor: "
             f"{fmt_ratio(ratios['tfsurgery_over_floor'])}"]
    ours = model["variants"]["tfsurgery"]
    if ours.get("transform_seconds"):
        notes.append("tfsurgery time by transform: " + ", ".join(
            f"{name} {fmt_seconds(sec)}" for name, sec in ours["transform_seconds"].items()))
    if ours.get("onnx", {}).get("histogram"):
        notes.append("tfsurgery ONNX ops (tf2onnx): " + histogram_text(ours["onnx"]["histogram"]))
    if ours.get("onnx", {}).get("ort_basic_histogram"):
        tidied = ", ".join(f"{n} {what}" for what, n in ours["onnx"].get("tidied", {}).items())
        notes.append(f"tfsurgery ONNX ops as written ({tidied or 'nothing tidied'}; ORT basic): "
                     + histogram_text(ours["onnx"]["ort_basic_histogram"]))
    for variant in VARIANTS:
        row = model["variants"][variant]
        if "run_error" in row:
            notes.append(f"{variant}: {row['run_error']}")
        if "onnx" in row and "error" in row["onnx"]:
            notes.append(f"{variant} ONNX: {row['onnx']['error']}")
    deployment = []
    if model.get("deployment"):
        from benchmarks import deploy
        deployment = ["", deploy.render(model["model"], model["deployment"])]
    return "\n".join([f"### {model['model']}", "", markdown_table(header, model_rows(model)), "",
                      *[f"- {note}" for note in notes], *deployment])


def render_scaling(rows: List[dict]) -> str:
    table = markdown_table(
        ["blocks", "nodes", "nodes after", "pipeline time", "its runs", "µs / node",
         "parse+serialize", "floor µs / node", "ratio"],
        [[r["blocks"], r["nodes"], r["nodes_after"], fmt_seconds(r["seconds"]),
          " – ".join(map(fmt_seconds, r.get("seconds_range") or [])),
          f"{r['us_per_node']:.1f}", fmt_seconds(r["floor_seconds"]),
          f"{r['floor_us_per_node']:.2f}", f"{r['seconds'] / r['floor_seconds']:.1f}×"]
         for r in rows])
    return ("## Scaling\n\n`models.synthetic.repeated_blocks(n)` (conv + bias → FusedBatchNormV3 → "
            "Relu, about 10 nodes per block), `pipeline.run` with every transform including "
            "fold-batch-norm, no verification; per size the median of the interleaved repeats "
            "(\"its runs\": the fastest and slowest of them), the floor timed in the same loop; "
            "ratio: pipeline time over the floor.\n\n" + table)


def render_training(section) -> str:
    title = "## Training ops: one Adam step (`benchmarks.training`)\n\n"
    if section is None:
        return ""
    if "error" in section:
        return title + f"Not run: {section['error']}"
    scalars = {k: v for k, v in section.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in section.items() if isinstance(v, dict)}
    variants = list(dict.fromkeys(name for table in tables.values() for name in table))
    rows = [[name] + [format_value(tables[k].get(name)) for k in tables] for name in variants]
    lines = [", ".join(f"{k}: {format_value(v)}" for k, v in scalars.items()), ""]
    if rows:
        lines.append(markdown_table(["variant", *tables], rows))
    return title + "\n".join(lines)


def histogram_text(histogram: dict) -> str:
    ordered = sorted(histogram.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{count} {op}" for op, count in ordered)


def format_value(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_targets(checks: List[dict]) -> str:
    rows = [[c["target"], c["value"], "met" if c["met"] else "**missed**"] for c in checks]
    return "## Targets\n\n" + markdown_table(["target", "measured", ""], rows, "lll")


def replace_target_row(document: str, check: dict) -> str:
    """``document`` with the Targets row of ``check`` (found by its target text) re-measured;
    a target the document does not list yet is left out (a full run adds it)."""
    old_row = re.compile(rf"^\| {re.escape(check['target'])} \|.*$", re.M)
    new_row = markdown_table(["target", "measured", ""],
                             [[check["target"], check["value"],
                               "met" if check["met"] else "**missed**"]], "lll").splitlines()[-1]
    return old_row.sub(lambda _: new_row, document, count=1)


def render_markdown(result: dict) -> str:
    m, s = result["machine"], result["settings"]
    parts = [
        "# Benchmark",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM; {m['os']}; "
        f"Python {m['python']}, TensorFlow {m['tensorflow']}, tf2onnx {m['tf2onnx']}, "
        f"onnxruntime {m['onnxruntime']}; {m['date']}; load average at start "
        f"{' / '.join(map(str, m['load_average_at_start']))} (1/5/15 min).",
        "",
        f"Regenerate: `python scripts/benchmark.py --training-ops` (this run: "
        f"{s['repeats']} interleaved repeats, median; Keras applications at input "
        f"{s['input_size']}×{s['input_size']}; ONNX opset {s['opset']}).",
        "",
        "Variants: **original**; **optimize_for_inference** = "
        "`optimize_for_inference_lib.optimize_for_inference` (inputs, outputs, input dtype); "
        f"**grappler** = `tf_optimizer.OptimizeGraph` with "
        f"{' + '.join(f'`{o}`' for o in s['grappler_optimizers'])}, one iteration, outputs as "
        "fetch nodes (time of the OptimizeGraph call only, not of building the MetaGraph); "
        "**tfsurgery** = `api.optimize(..., choose_transforms(bn_fold=True), "
        "checks=Checks(verify=False))` (load excluded, GraphDef in → GraphDef out). "
        "No peer gets special "
        "treatment of training flags: each is run as users run it.",
        "",
        "Max error: max |variant − original| / max |original| over the outputs, same seeded feeds, "
        "training flags fed False. ONNX: node count out of `tf2onnx.convert.from_graph_def`, and "
        "after onnxruntime's basic graph rewrites (for tfsurgery: after removing the identity "
        "Reshapes tf2onnx leaves, too — what `--onnx` / `tfsurgery export` writes); `If` counts "
        "the raw conversion. Floor: `GraphDef.FromString` + `SerializeToString` of the original.",
        "",
        LEFTOVER_DEFINITION,
        "",
    ]
    if result.get("targets"):
        parts += [render_targets(result["targets"]), ""]
    parts += ["## Models", ""]
    for model in result["models"]:
        parts += [render_model(model), ""]
    if result.get("scaling"):
        parts += [render_scaling(result["scaling"]), ""]
    training = render_training(result.get("training_ops"))
    if training:
        parts += [training, ""]
    return "\n".join(parts)
