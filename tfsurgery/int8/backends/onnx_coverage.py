"""What onnxruntime's quantizers can and cannot make int8 in a float ONNX model.

onnxruntime quantizes by op type: its static (QDQ) quantizer knows ``MatMul``, ``Gemm``,
``Conv``, ``LayerNormalization``... but not com.microsoft ``Attention``, which its dynamic
quantizer turns into ``QAttention``; the dynamic one has no ``Gemm``. So on a fused transformer
ONNX, static int8 leaves every attention's Q/K/V projections float. The report says what each
mode leaves float (never silently): :func:`left_float_note`.
"""
from pathlib import Path
from typing import Dict, List

DYNAMIC = "dynamic"                # as int8.loop.DYNAMIC (a Choice's mode)
# ops whose weights a quantizer makes int8 (what a user calls a layer), in either mode
WEIGHT_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM", "Gather",
              "EmbedLayerNormalization")


def untyped_as_float() -> dict:
    """onnxruntime's quantizers stop at a tensor onnx's shape inference cannot type (the
    outputs of com.microsoft ops it has no schema for, e.g. in a user's own fused ONNX):
    such a tensor is float (our splices type their outputs; this covers the rest)."""
    import onnx
    return {"DefaultTensorType": onnx.TensorProto.FLOAT}


def left_float(float_model: Path, mode: str) -> Dict[str, int]:
    """Layers (WEIGHT_OPS with a float initializer of rank ≥ 2) that onnxruntime's quantizer
    for ``mode`` has no int8 form of — they stay float — counted by op type.
    Static (QDQ) has none for com.microsoft ``Attention``; dynamic none for ``Gemm``."""
    import onnx
    from onnxruntime.quantization import registry
    quantizable = registry.IntegerOpsRegistry if mode == DYNAMIC else registry.QDQRegistry
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
    """:func:`left_float` as one phrase for the report (none when nothing is left float)."""
    counts = left_float(float_model, mode)
    if not counts:
        return []
    ops = ", ".join(f"{op} ×{n}" for op, n in sorted(counts.items()))
    return [f"{ops} left float (onnxruntime's {'dynamic' if mode == DYNAMIC else 'static'} "
            "quantizer has no int8 form of it)"]
