"""The op vocabulary: which ops are placeholders, identities, linear layers, batch norms, control
flow — and the small naming helpers every module needs. One place, so the sets never drift apart."""
from __future__ import annotations

import re

PLACEHOLDER_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})
FEEDABLE_PLACEHOLDER_OPS = frozenset({"Placeholder", "PlaceholderV2"})   # no value of their own

# Ops that forward their first input unchanged at inference.
IDENTITY_OPS = frozenset({"Identity", "Snapshot", "StopGradient", "PreventGradient"})
# ...and, for constant lookups, a ReadVariableOp of a frozen variable too.
FORWARDING_OPS = IDENTITY_OPS | {"IdentityN", "ReadVariableOp"}

# Batch norm as one op, and the linear layers a batch norm (or any per-channel affine) folds into.
FUSED_BATCH_NORM_OPS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
FOLDABLE_LINEAR_OPS = frozenset({"Conv2D", "DepthwiseConv2dNative", "Conv3D", "MatMul",
                                 "Conv2DBackpropInput", "Conv3DBackpropInputV2"})

VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp", "AutoReloadVariable",
                          "_VarHandlesOp"})

# v1 control flow (Switch/Merge conds, Enter/Exit while loops).
CONTROL_FLOW_V1_OPS = frozenset({
    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
    "NextIteration", "RefNextIteration", "LoopCond", "ControlTrigger"})
FRAME_OPS = frozenset({"Enter", "RefEnter", "Exit", "RefExit", "NextIteration",
                       "RefNextIteration", "LoopCond"})

# Functional (v2) control flow and function calls: bodies in the function library.
FUNCTION_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
FUNCTIONAL_IF_OPS = frozenset({"If", "StatelessIf"})
FUNCTIONAL_CASE_OPS = frozenset({"Case", "StatelessCase"})
FUNCTIONAL_WHILE_OPS = frozenset({"While", "StatelessWhile"})
FUNCTIONAL_CONTROL_FLOW_OPS = FUNCTIONAL_IF_OPS | FUNCTIONAL_CASE_OPS | FUNCTIONAL_WHILE_OPS

# Random ops — one vocabulary for interface detection (dropout knobs), remove-dropout and the
# verifier's reference, so what one removes the other can neutralise.
UNIFORM_RANDOM_OPS = frozenset({"RandomUniform", "StatelessRandomUniform",
                                "StatelessRandomUniformV2", "RandomUniformInt",
                                "StatelessRandomUniformInt", "StatelessRandomUniformIntV2"})
INTEGER_UNIFORM_RANDOM_OPS = frozenset({"RandomUniformInt", "StatelessRandomUniformInt",
                                        "StatelessRandomUniformIntV2"})
NORMAL_RANDOM_OPS = frozenset({"RandomStandardNormal", "TruncatedNormal",
                               "StatelessRandomNormal", "StatelessRandomNormalV2",
                               "StatelessTruncatedNormal", "StatelessTruncatedNormalV2"})
# Stateful random ops whose ``seed``/``seed2`` attributes decide their values.
SEEDED_RANDOM_OPS = frozenset({"RandomUniform", "RandomStandardNormal", "TruncatedNormal",
                               "RandomUniformInt", "RandomGamma", "RandomPoisson",
                               "RandomPoissonV2", "RandomShuffle", "Multinomial"})
RANDOM_OPS = UNIFORM_RANDOM_OPS | NORMAL_RANDOM_OPS | SEEDED_RANDOM_OPS | frozenset({
    "StatelessMultinomial", "StatelessRandomGammaV2", "StatelessRandomPoisson",
    "StatelessRandomBinomial", "RandomGammaGrad"})

# Nodes that compute nothing an output could be: not detected as outputs.
NOT_OUTPUT_OPS = frozenset({"Const", "NoOp", "Placeholder", "PlaceholderWithDefault", "Assert",
                            "SaveV2", "RestoreV2"})


def tensor_name(ref: str) -> str:
    """``"a"`` → ``"a:0"``; ``"a:1"`` unchanged (what Session.run and ONNX names expect)."""
    return ref if ":" in ref else ref + ":0"


def node_name(ref: str) -> str:
    """``"a:1"`` / ``"^a"`` / ``"a"`` → ``"a"``."""
    ref = ref[1:] if ref.startswith("^") else ref
    name, sep, port = ref.rpartition(":")
    return name if sep and port.isdigit() else ref


def first_line(error, limit: int = 300) -> str:
    """A one-line message from an exception (or text), whitespace folded. TensorFlow and
    onnxruntime put the failing node and the reason late in long messages, so a shortened message
    keeps its head and its tail, and any ``{{node NAME}}`` it mentions."""
    text = " ".join(str(error).split()) or type(error).__name__
    text = text.replace("Graph execution error: ", "")
    if len(text) <= limit:
        return text
    node = re.search(r"\{\{node ([^}]+)\}\}", text)
    named = f" [node {node.group(1)}]" if node else ""
    keep = limit - len(named) - 3
    short = f"{text[:keep // 2]} … {text[-(keep - keep // 2):]}"
    return short + (named if node and node.group(1) not in short else "")
