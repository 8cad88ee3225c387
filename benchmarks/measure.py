"""Measuring: interleaved timing against the parse+serialize floor, the ops an inference graph
should not have, output errors, ONNX node counts, the scaling run, the machine."""
from __future__ import annotations

import collections
import datetime
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import numpy as np

from benchmarks.peers import (GRAPPLER_OPTIMIZERS, VARIANTS, grappler_config,
                              grappler_meta_graph, run_grappler, run_optimize_for_inference,
                              run_tfsurgery)
from tfsurgery import api, pipeline
from tfsurgery.export import onnx as onnx_export
from tfsurgery.export import onnx_tidy
from tfsurgery.verify import check as verify
from tfsurgery.contract import Options
from tfsurgery.constants import constant_nodes
from tfsurgery.ops import FUSED_BATCH_NORM_OPS, first_line

SCALING_BLOCKS = (200, 2000, 20000)       # ~10 nodes per block: 2k, 20k, 200k nodes
QUICK_SCALING_BLOCKS = (200, 2000)
# What "left over" means (documented in the Markdown).
COND_DROPOUT = ("Switch", "Merge", "RandomUniform")


LINEAR = ("Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul", "BatchMatMulV2",
          "BatchMatMulV3", "Conv2DBackpropInput", "Conv3DBackpropInputV2")
ADDITIVE = ("BiasAdd", "Add", "AddV2", "Sub")
AFFINE = ADDITIVE + ("Mul",)
PASS_THROUGH = ("BatchToSpaceND", "Identity")      # layout/no-op links a chain may cross
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
