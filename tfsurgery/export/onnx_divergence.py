"""Where an ONNX export parts from TensorFlow: the first converted tensor that differs (the
check's courtesy after a failure, as Polygraphy's ``--onnx-outputs mark all`` compares every
tensor both models have). ``onnx_feeds``: the TF feeds as the ONNX model takes them."""
from __future__ import annotations

from typing import Optional

import numpy as np

from tfsurgery.verify import check as verify


def first_onnx_divergence(graph_def, model, feeds, onnx_feeds, tolerance: float,
                          timeout: float) -> Optional[str]:
    """The first ONNX node (in the model's order) whose output differs from the TensorFlow
    tensor of the same name beyond the tolerance: tf2onnx names the tensors it converts after
    TensorFlow's, so every such pair is fetched — the ONNX ones as extra graph outputs, run
    without onnxruntime's rewrites — and compared. None when no common tensor differs."""
    import onnx
    import onnxruntime as ort
    present = {node.name for node in graph_def.node}
    candidates = [(out, node) for node in model.graph.node for out in node.output
                  if ":" in out and out.rsplit(":", 1)[0] in present]
    if not candidates:
        return None
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    typed = {v.name: v for v in onnx.shape_inference.infer_shapes(probe).graph.value_info}
    candidates = [(out, node) for out, node in candidates if out in typed]
    existing = {o.name for o in probe.graph.output}
    probe.graph.output.extend(typed[out] for out, _ in candidates if out not in existing)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        onnx_values = session.run([out for out, _ in candidates],
                                  {k: v for k, v in onnx_feeds.items()
                                   if k in wanted})
        tf_values = verify.run_graph(graph_def, feeds, [out for out, _ in candidates],
                                     timeout=timeout, label="the optimized graph")
    except Exception:  # noqa: BLE001 - localizing is a courtesy: never mask the failure itself
        return None
    for (out, node), expected, actual in zip(candidates, tf_values, onnx_values):
        # tf2onnx runs NHWC chains channels-first in between: the same values, transposed
        layouts = [actual] + ([np.moveaxis(actual, 1, -1)] if np.ndim(actual) in (4, 5) else [])
        errors = [verify.output_error(out, expected, value).max_rel for value in layouts
                  if np.shape(value) == np.shape(expected)]
        if not errors:
            continue                      # a different shape: not the same tensor
        error = min(errors)
        if error > tolerance:
            return (f"first diverging ONNX node '{node.name}' ({node.op_type}), output "
                    f"'{out}': relative error {error:.3g} against TensorFlow")
    return None
