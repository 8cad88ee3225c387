"""What onnxruntime's quantizers make int8 in a float ONNX model, and what they leave float.

onnxruntime quantizes by op type: its static (QDQ) quantizer knows ``MatMul``, ``Gemm``,
``Conv``, ``LayerNormalization``... but not com.microsoft ``Attention``, which its dynamic
quantizer turns into ``QAttention``; the dynamic one has no ``Gemm``. So on a fused transformer
ONNX, static int8 leaves every attention's Q/K/V projections float. The report says what each
mode leaves float (never silently): :func:`left_float_note`.

Dynamic int8 here quantizes compute only (:func:`dynamic_op_types`): a table lookup (``Gather``,
``EmbedLayerNormalization``) made int8 runs no faster and rounds every token's embedding — on a
4-layer BERT (hidden 256, seq 128, 32 unseen rows) keeping the tables float took the pooled
output's max relative error from 0.104 to 0.094 and the sequence's from 0.0231 to 0.0217
(onnxruntime's recipe on tf2onnx's ONNX, tables int8: 0.118 and 0.0252). The price is size:
the tables stay float32.
"""
from pathlib import Path
from typing import Dict, List

from tfsurgery.int8.loop import DYNAMIC

# ops whose weights a quantizer makes int8 (what a user calls a layer), in either mode
WEIGHT_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM", "Gather",
              "EmbedLayerNormalization")
LOOKUPS = ("Gather", "EmbedLayerNormalization")     # kept float by dynamic int8


def untyped_as_float() -> dict:
    """onnxruntime's quantizers stop at a tensor onnx's shape inference cannot type (the
    outputs of com.microsoft ops it has no schema for, e.g. in a user's own fused ONNX):
    such a tensor is float (our splices type their outputs; this covers the rest)."""
    import onnx
    return {"DefaultTensorType": onnx.TensorProto.FLOAT}


def dynamic_op_types() -> List[str]:
    """The op types dynamic int8 quantizes: onnxruntime's dynamic ones but the lookups."""
    from onnxruntime.quantization import registry
    return sorted(set(registry.IntegerOpsRegistry) - set(LOOKUPS))


def left_float(float_model: Path, mode: str) -> Dict[str, int]:
    """Layers (WEIGHT_OPS with a float initializer of rank ≥ 2) that ``mode``'s quantizer
    leaves float, counted by op type: those it has no int8 form of (static: com.microsoft
    ``Attention``; dynamic: ``Gemm``) and, dynamic, the lookups."""
    import onnx
    from onnxruntime.quantization import registry
    quantizable = dynamic_op_types() if mode == DYNAMIC else registry.QDQRegistry
    model = onnx.load(str(float_model), load_external_data=False)
    matrices = {init.name for init in model.graph.initializer if len(init.dims) >= 2 and
                init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)}
    counts: Dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in WEIGHT_OPS and node.op_type not in quantizable and \
                any(name in matrices for name in node.input):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def left_float_note(float_model: Path, mode: str) -> List[str]:
    """:func:`left_float` as phrases for the report (none when nothing is left float)."""
    counts = left_float(float_model, mode)
    lookups = {op: n for op, n in counts.items() if mode == DYNAMIC and op in LOOKUPS}
    missing = {op: n for op, n in counts.items() if op not in lookups}
    notes = []
    if missing:
        notes.append(f"{_counted(missing)} left float (onnxruntime's "
                     f"{'dynamic' if mode == DYNAMIC else 'static'} quantizer has no int8 form "
                     "of it)")
    if lookups:
        notes.append(f"{_counted(lookups)} kept float (a table lookup: int8 would make it no "
                     "faster, only less accurate)")
    return notes


def _counted(counts: Dict[str, int]) -> str:
    return ", ".join(f"{op} ×{n}" for op, n in sorted(counts.items()))
