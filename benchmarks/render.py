"""Rendering a run as Markdown (``docs/benchmark.md``): the machine, the method, the targets,
one table per model, the scaling run, the training ops."""
from __future__ import annotations

import re
from typing import List

from benchmarks.common import markdown_table
from benchmarks.peers import VARIANTS

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
