"""The benchmark's targets, every threshold in this one place, each checked against a run's
measurements (``check_targets``: the target, the value measured, met or not)."""
from __future__ import annotations

from typing import List

from benchmarks.render import fmt_error, fmt_ratio, histogram_text

# ---------------------------------------------------------------- thresholds
TOLERANCE = 1e-4                  # outputs within this, relative to each output's magnitude
# the simplification goal: fewer TF nodes than Grappler on every model, these counts at most
LEAN_TF_NODES = {"EfficientNetB0": 560, "ResNet50": 285, "MobileNetV2": 262}
LEAN_ONNX_NODES = {"EfficientNetB0": 235}           # after onnxruntime's basic rewrites
NODE_LIMITS = {"ResNet50": (300, 130), "MobileNetV2": (275, 110)}   # TF, ONNX (tf2onnx) nodes
ARTICLE_ONNX_NODES = 14                             # the demo as `tfsurgery export` writes it
RESNET50_TIME_LIMITS = {"tfsurgery_over_grappler": (1 / 3, "≤ 1/3 of Grappler's time"),
                        "tfsurgery_over_floor": (3, "≤ 3× parse+serialize time")}
FLOOR_RATIO = 15                  # scaling: pipeline time per node vs the floor (the 15x goal)
FLAT_RATIO = 1.5      # "time per node stays flat": slowest / fastest µs per node at most this


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

    for name, (tf_max, onnx_max) in NODE_LIMITS.items():
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
        for key, (limit, text) in RESNET50_TIME_LIMITS.items():
            value = ratios.get(key)
            add(f"ResNet50: tfsurgery {text}", fmt_ratio(value),
                value is not None and value <= limit)

    article = models.get("article_cnn", {}).get("variants", {}).get("tfsurgery")
    if article and "onnx" in article:
        onnx = article["onnx"]
        exported = onnx.get("ort_basic_nodes", onnx.get("nodes"))
        add(f"article_cnn: exports with no If and ≤ {ARTICLE_ONNX_NODES} ONNX nodes (as "
            "`tfsurgery export`: tf2onnx + ORT basic)",
            f"{exported} nodes, {onnx.get('if', '?')} If (raw tf2onnx: {onnx.get('nodes')})",
            exported is not None and exported <= ARTICLE_ONNX_NODES and onnx.get("if") == 0)

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
