"""Benchmark: tfsurgery against its peers on the same graphs, in one run.

For each model, four variants side by side — the original, TensorFlow's
``optimize_for_inference_lib``, offline Grappler (constant folding + arithmetic through
``tf_optimizer``) and tfsurgery (``--bn-fold``) — with: TF node count, ops that should be gone
(see ``measure.leftover_ops``), max output error against the original, optimization time, and
the ONNX node count after tf2onnx (raw, and after onnxruntime's basic rewrites as ``tfsurgery
export`` does). The floor is the time protobuf takes to parse and serialize the same graph. A
synthetic scaling run times the pipeline on the same conv/BN block repeated to 2k, 20k and 200k
nodes.

Split by job: ``peers`` (the variants), ``measure`` (timing and counting), ``targets`` (every
threshold, checked), ``render`` (Markdown); ``deploy`` adds the artefacts. ``scripts/benchmark.py``
is the command line; ``run`` here returns everything as one JSON-able dict and
``render.render_markdown`` turns it into ``docs/benchmark.md``. The names of those modules are
importable from here too (``harness.X``).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from benchmarks.measure import (ADDITIVE, AFFINE, COND_DROPOUT, LINEAR,  # noqa: F401
                                PASS_THROUGH, QUICK_SCALING_BLOCKS, SCALING_BLOCKS,
                                benchmark_model, extra_affine_ops, leftover_ops, machine_info,
                                max_error, measure_variant, onnx_counts, parse_and_serialize,
                                scaling_run, time_interleaved, time_ratios,
                                training_ops_section)
from benchmarks.peers import (GRAPPLER_OPTIMIZERS, VARIANTS, build_model,  # noqa: F401
                              grappler_config, grappler_meta_graph, run_grappler,
                              run_optimize_for_inference, run_tfsurgery)
from benchmarks.render import (LEFTOVER_DEFINITION, fmt_error, fmt_onnx, fmt_ratio,  # noqa: F401
                               fmt_seconds, format_value, histogram_text, model_rows,
                               render_markdown, render_model, render_scaling, render_targets,
                               render_training, replace_target_row)
from benchmarks.targets import (ARTICLE_ONNX_NODES, FLAT_RATIO, FLOOR_RATIO,  # noqa: F401
                                LEAN_ONNX_NODES, LEAN_TF_NODES, NODE_LIMITS,
                                RESNET50_TIME_LIMITS, TOLERANCE, check_targets)
from tfsurgery.export import onnx as onnx_export

MODELS = ("article_cnn", "tf_keras", "MobileNetV2", "ResNet50", "EfficientNetB0")
QUICK_MODELS = ("article_cnn", "tf_keras")


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
