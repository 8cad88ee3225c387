"""The peers' simplification tests, re-created as small frozen TF1 graphs (issue 23).

Each case names the peer test whose input graph it re-creates, builds that graph with
``tf.compat.v1`` ops and seeded random values (placeholders where the peer used variables or fed
constants), and states what the peer expects of the simplified graph — as text, and as a check
on the op histogram (``expected``) that any result can be held to. ``benchmarks/simplify.py``
runs every case through tfsurgery and Grappler; ``tests/test_peer_graphs.py`` builds and checks
them all.

A name followed by "(… form)" adapts that test's pattern to another op, as the issue asks.

Peer files (abbreviations used in ``Case.peer``):
- AO   tensorflow/core/grappler/optimizers/arithmetic_optimizer_test.cc
- CF   tensorflow/core/grappler/optimizers/constant_folding_test.cc
- CSE  tensorflow/core/grappler/optimizers/common_subgraph_elimination_test.cc
       (the OpDedupping tests, in arithmetic_optimizer_test.cc before TF 2.4)
- GTC  tensorflow/tools/graph_transforms/fold_constants_test.cc
- GTQ  tensorflow/tools/graph_transforms/quantize_nodes_test.cc (its merge-duplicates tests)
- GTA  tensorflow/tools/graph_transforms/flatten_atrous_test.cc
- GTF  tensorflow/tools/graph_transforms/fuse_convolutions_test.cc
- T2O  onnx/tensorflow-onnx tests/test_optimizers.py
- T2OB onnx/tensorflow-onnx tests/test_backend.py
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfsurgery.models.common import BuiltModel
from tfsurgery.models.tf1 import v1_graph
from tfsurgery.report import op_histogram

PEER_FILES = {
    "AO": "tensorflow/core/grappler/optimizers/arithmetic_optimizer_test.cc",
    "CF": "tensorflow/core/grappler/optimizers/constant_folding_test.cc",
    "CSE": "tensorflow/core/grappler/optimizers/common_subgraph_elimination_test.cc",
    "GTC": "tensorflow/tools/graph_transforms/fold_constants_test.cc",
    "GTQ": "tensorflow/tools/graph_transforms/quantize_nodes_test.cc",
    "GTA": "tensorflow/tools/graph_transforms/flatten_atrous_test.cc",
    "GTF": "tensorflow/tools/graph_transforms/fuse_convolutions_test.cc",
    "T2O": "onnx/tensorflow-onnx tests/test_optimizers.py",
    "T2OB": "onnx/tensorflow-onnx tests/test_backend.py",
}

Histogram = Dict[str, int]


@dataclasses.dataclass
class Case:
    name: str
    peer: str                                  # "<file abbreviation> <test name>"
    expects: str                               # what the peer test asserts, in words
    expected: Callable[[Histogram], bool]      # that assertion, on an op histogram
    builder: Callable[[np.random.Generator], Optional[Sequence[str]]]
    group: str = ""                            # the section of this file it is in
    seed: int = 0

    def build(self) -> BuiltModel:
        """The graph: placeholders are its inputs; outputs as the builder says (else "output")."""
        with v1_graph() as graph:
            outputs = self.builder(np.random.default_rng(self.seed)) or ["output"]
        graph_def = graph.as_graph_def()
        inputs = [n.name for n in graph_def.node if n.op == "Placeholder"]
        return BuiltModel(graph_def, inputs, list(outputs))

    @property
    def peer_file(self) -> str:
        return PEER_FILES[self.peer.split()[0]]


CASES: List[Case] = []
_GROUP = {"now": ""}


def group(title: str) -> None:
    """The cases registered from here on belong to ``title``."""
    _GROUP["now"] = title


def case(name: str, peer: str, expects: str, expected: Callable[[Histogram], bool]):
    def register(builder):
        CASES.append(Case(name, peer, expects, expected, builder, group=_GROUP["now"],
                          seed=len(CASES)))
        return builder
    return register


def by_name(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


histogram = op_histogram            # the report's own: one op histogram


# ---------------------------------------------------------------- expectation helpers
def absent(*ops: str) -> Callable[[Histogram], bool]:
    return lambda h: all(h.get(op, 0) == 0 for op in ops)


def at_most(**counts: int) -> Callable[[Histogram], bool]:
    return lambda h: all(h.get(op, 0) <= n for op, n in counts.items())


def nodes_at_most(limit: int) -> Callable[[Histogram], bool]:
    return lambda h: sum(h.values()) <= limit


def all_of(*checks: Callable[[Histogram], bool]) -> Callable[[Histogram], bool]:
    return lambda h: all(check(h) for check in checks)


# ---------------------------------------------------------------- building helpers
def ph(name: str, shape, dtype=tf.float32):
    return tf.compat.v1.placeholder(dtype, shape, name=name)


def const(r: np.random.Generator, shape, low=None, high=None, name=None):
    value = r.uniform(low, high, shape) if low is not None else r.standard_normal(shape)
    return tf.constant(np.asarray(value, np.float32), name=name)


def same_const(value: np.ndarray, name=None):
    """A Const of a given array: equal constants that are separate nodes, as real graphs hold."""
    return tf.constant(value, name=name)


def out(tensor, name: str = "output"):
    return tf.identity(tensor, name=name)


def conv_weights(r, shape):
    """Random weights scaled by the fan-in, so outputs stay near unit size."""
    fan_in = int(np.prod(shape[:-1]))
    return tf.constant((r.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


# ================================================================ duplicates
group("duplicates")


@case("dup_identical_convs", "CSE OpDedupping (Conv2D form)",
      "two equal Conv2D on one input (equal weights, separate Consts) merged: 1 Conv2D",
      at_most(Conv2D=1))
def _dup_identical_convs(r):
    x = ph("input", [1, 8, 8, 3])
    w = r.standard_normal([3, 3, 3, 4]).astype(np.float32)
    a = tf.nn.conv2d(x, same_const(w), [1, 1, 1, 1], "SAME")
    b = tf.nn.conv2d(x, same_const(w), [1, 1, 1, 1], "SAME")
    out(a * b)


@case("dup_conv_branches", "CSE OpDedupping (conv+bias+Relu branch form)",
      "two equal conv+bias+Relu branches on one input merged: 1 Conv2D, 1 BiasAdd, 1 Relu",
      at_most(Conv2D=1, BiasAdd=1, Relu=1))
def _dup_conv_branches(r):
    x = ph("input", [1, 8, 8, 3])
    w = r.standard_normal([3, 3, 3, 4]).astype(np.float32)
    bias = r.standard_normal([4]).astype(np.float32)
    branches = [tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, same_const(w), [1, 1, 1, 1], "SAME"),
                                          same_const(bias))) for _ in range(2)]
    out(tf.concat(branches, axis=3))


@case("dup_transposes", "CSE OpDedupping (Transpose form)",
      "two Transposes of one tensor with equal perms merged: 1 Transpose",
      at_most(Transpose=1))
def _dup_transposes(r):
    x = ph("input", [2, 3, 4])
    a = tf.transpose(x, [0, 2, 1])
    b = tf.transpose(x, [0, 2, 1])
    out(a + 2.0 * b)


@case("dup_add_twice", "CSE OpDedupping",
      "Add(a, b) computed twice merged: 1 Add/AddV2",
      lambda h: h.get("Add", 0) + h.get("AddV2", 0) <= 1)
def _dup_add_twice(r):
    a, b = ph("a", [4, 5]), ph("b", [4, 5])
    out(tf.multiply(tf.add(a, b), tf.add(a, b)))


@case("dup_commutative", "CSE OpDedupCommutative",
      "Add(a, b) and Add(b, a) merged (commutative): 1 Add/AddV2",
      lambda h: h.get("Add", 0) + h.get("AddV2", 0) <= 1)
def _dup_commutative(r):
    a, b = ph("a", [4, 5]), ph("b", [4, 5])
    out(tf.multiply(tf.add(a, b), tf.add(b, a)))


@case("dup_input_adds", "T2O test_duplicated_duplicated_input",
      "op1 = x+x, op2 = x+x, op3 = op1*op2, op4 = op3+x: op1/op2 merged, 2 Adds left",
      lambda h: h.get("Add", 0) + h.get("AddV2", 0) <= 2)
def _dup_input_adds(r):
    x = ph("input", [5, 5])
    op1, op2 = tf.add(x, x), tf.add(x, x)
    out(tf.add(op1 * op2, x))


@case("dup_three_constants", "T2O test_duplicated_duplicated_constants",
      "three equal constants merged into one (plus the concat axis): ≤ 2 Const",
      at_most(Const=2))
def _dup_three_constants(r):
    x = ph("input", [2, 3])
    c = r.standard_normal([2, 3]).astype(np.float32)
    out(tf.concat([x + same_const(c), x * same_const(c), x - same_const(c)], axis=0))


@case("dup_reduce_attrs", "T2O test_duplicated_duplicated_attributes",
      "Sum(x, axis 1) twice and Sum(x, axis 0) once: 2 Sum left",
      at_most(Sum=2))
def _dup_reduce_attrs(r):
    x = ph("input", [3, 3])
    a = tf.reduce_sum(x, axis=1, keepdims=True)
    b = tf.reduce_sum(x, axis=1, keepdims=True)
    c = tf.reduce_sum(x, axis=0, keepdims=True)
    out(a * b + c)


@case("dup_chains", "T2O test_duplicated_need_multiple_run",
      "two equal Tanh→Sigmoid→Log chains (the peer's are Log→Log→Log) merged over several "
      "rounds: one of each op",
      at_most(Tanh=1, Sigmoid=1, Log=1))
def _dup_chains(r):
    x = ph("input", [3, 3])
    chains = [tf.math.log(tf.sigmoid(tf.tanh(x))) for _ in range(2)]   # finite for every x
    out(chains[0] + chains[1])


@case("dup_merge_nested", "GTQ TestMergeDuplicatesNested",
      "a_op == b_op (equal constants, each under a Relu) merged: 1 Relu feeds both Add inputs",
      at_most(Relu=1))
def _dup_merge_nested(r):
    x = ph("input", [10])
    k = np.arange(1, 11, dtype=np.float32) * r.uniform(0.5, 1.5)
    a = tf.nn.relu(x + same_const(k))
    b = tf.nn.relu(x + same_const(k))
    c = same_const((np.arange(10) + 2.0).astype(np.float32))
    out(tf.add(a, b) * c)


@case("dup_merge_duplicates", "GTQ TestMergeDuplicateConsts",
      "a_op == b_op: one of them left, add_op reads it twice",
      lambda h: h.get("Mul", 0) <= 2)
def _dup_merge_duplicates(r):
    x = ph("input", [10])
    k = r.standard_normal(10).astype(np.float32)
    c = r.standard_normal(10).astype(np.float32)
    out(tf.multiply(tf.add(x * same_const(k), x * same_const(k)), same_const(c)))


@case("dup_merge_in_out", "GTQ TestMergeDuplicatesInOut",
      "mul_op2 == mul_op3 merged; mul_op1, equal too but an output, kept: 3 Mul",
      at_most(Mul=3))
def _dup_merge_in_out(r):
    x = ph("input", [10])
    k = r.standard_normal(10).astype(np.float32)
    c = r.standard_normal(10).astype(np.float32)
    add = tf.add(tf.nn.relu(x + same_const(k)), tf.nn.relu(x + same_const(k)))
    tf.multiply(add, same_const(c), name="mul_op1")
    mul2, mul3 = tf.multiply(add, same_const(c)), tf.multiply(add, same_const(c))
    tf.multiply(mul2, mul3, name="final_mul_op")
    return ["mul_op1", "final_mul_op"]


# ================================================================ shapes of static tensors
group("shapes")


@case("shape_materialization", "CF ShapeMaterialization",
      "Shape/Size/Rank of statically shaped tensors become Consts: no Shape, Size, Rank",
      absent("Shape", "Size", "Rank"))
def _shape_materialization(r):
    v1, v2, v3 = ph("v1", [3]), ph("v2", [5, 7]), ph("v3", [11, 13])
    rank = tf.raw_ops.Rank(input=v3)
    size = tf.raw_ops.Size(input=v2)
    shape = tf.raw_ops.Shape(input=v1)
    p = tf.cast(rank * size * shape, tf.float32)
    out(p * v1)


@case("shape_materialization_shape_n", "CF ShapeMaterializationShapeN",
      "ShapeN outputs of static tensors become Consts (their Prods fold); the unknown one "
      "stays: no Prod, ≤ 1 ShapeN/Shape",
      lambda h: h.get("Prod", 0) == 0 and h.get("ShapeN", 0) + h.get("Shape", 0) <= 1)
def _shape_materialization_shape_n(r):
    v1, v2 = ph("v1", [3, 4]), ph("v2", [5, 6])
    v3 = ph("v3", [None, 4])
    s1, s2, s3 = tf.raw_ops.ShapeN(input=[v1, v2, v3])
    static = tf.cast(tf.reduce_prod(s1) * tf.reduce_prod(s2), tf.float32)
    batch = tf.cast(s3[0], tf.float32)
    out(tf.reduce_sum(v1) + tf.reduce_sum(v2) + tf.reduce_sum(v3) * static + batch)


@case("identity_reshape", "AO RemoveRedundantReshape_IdentityReshape",
      "Reshape(x, concat(shape(x)[:1], [3, 28, 28])) of x [-1, 3, 28, 28] removed: no Reshape",
      absent("Reshape"))
def _identity_reshape(r):
    x = ph("input", [None, 3, 28, 28])
    batch = tf.slice(tf.shape(x), [0], [1])
    target = tf.concat([batch, tf.constant([3, 28, 28])], axis=0, name="target_shape")
    out(tf.reshape(x, target), "outputs")
    return ["outputs"]


@case("identity_reshape_static", "CF NoOpReshape",
      "Reshape of a static tensor to its own shape removed: no Reshape, no Shape",
      absent("Reshape", "Shape"))
def _identity_reshape_static(r):
    x = ph("input", [2, 3, 4])
    out(tf.reshape(tf.nn.relu(x), tf.raw_ops.Shape(input=x)))


# ================================================================ algebra
group("algebra")


@case("negation", "AO RemoveNegation",
      "x+(−y) → x−y, (−x)+y → y−x, x−(−y) → x+y and alike: only −x of (−x)−y forms left, "
      "≤ 1 Neg", at_most(Neg=1))
def _negation(r):
    x, y = ph("x", [2, 2]), ph("y", [2, 2])
    nx, ny = tf.negative(x), tf.negative(y)
    terms = [x + y, nx + y, x + ny, nx + ny, x - y, nx - y, x - ny, nx - ny]
    out(tf.concat(terms, axis=0))     # the peer's AddN of these cancels to 0: keep each term


@case("logical_not", "AO RemoveLogicalNot",
      "LogicalNot(a < b) → a >= b and the other five comparisons: no LogicalNot",
      absent("LogicalNot"))
def _logical_not(r):
    a, b = ph("a", [6]), ph("b", [6])
    a, b = tf.round(a), tf.round(b)        # small integers: some elements compare equal
    names = []
    for index, compare in enumerate((tf.equal, tf.not_equal, tf.less, tf.less_equal,
                                     tf.greater, tf.greater_equal)):
        names.append(f"output_{index}")
        tf.identity(tf.logical_not(compare(a, b)), name=names[-1])
    return names


@case("involution_adjacent", "AO RemoveInvolution_AdjacentNodes",
      "Neg(Neg(x)), Reciprocal(Reciprocal(x)) removed: only the input and the Identity left",
      nodes_at_most(2))
def _involution_adjacent(r):
    x = ph("input", [2, 3])
    y = tf.math.reciprocal(tf.math.reciprocal(tf.negative(tf.negative(x))))
    out(y)


@case("involution_around_chain", "AO RemoveInvolution_AroundValuePreservingChain",
      "Reciprocal → Identity → Squeeze → Reciprocal: both Reciprocals removed",
      absent("Reciprocal"))
def _involution_around_chain(r):
    x = ph("input", [2, 1, 3])
    y = tf.math.reciprocal(x)
    y = tf.squeeze(tf.identity(y), axis=[1])
    out(tf.math.reciprocal(y))


@case("hoist_factor_mul", "AO HoistFactorMul",
      "x*y1 + y2*x → x*(y1+y2): 1 Mul",
      at_most(Mul=1))
def _hoist_factor_mul(r):
    x, y1, y2 = ph("x", [2, 3]), ph("y1", [2, 3]), ph("y2", [2, 3])
    out(tf.add(x * y1, y2 * x))


@case("hoist_factor_div", "AO HoistFactorDiv",
      "y1/x + y2/x → (y1+y2)/x: 1 RealDiv",
      lambda h: h.get("RealDiv", 0) + h.get("Div", 0) <= 1)
def _hoist_factor_div(r):
    x = ph("x", [2, 3])
    y1, y2 = ph("y1", [2, 3]), ph("y2", [2, 3])
    out(tf.add(y1 / x, y2 / x))


@case("trivial_sums_simple", "AO TrivialSumsSimple",
      "Add(x, x) → Mul(x, 2): no Add",
      lambda h: h.get("Add", 0) + h.get("AddV2", 0) == 0)
def _trivial_sums_simple(r):
    x = ph("input", [2, 2])
    out(tf.add(x, x))


@case("trivial_sums_repeated", "AO TrivialSumsRepeatedAdd",
      "sums of the same p (p+p, twice, added up) → one Mul(p, const): no Add/AddN",
      lambda h: h.get("Add", 0) + h.get("AddV2", 0) + h.get("AddN", 0) == 0)
def _trivial_sums_repeated(r):
    p = ph("input", [10, 10])
    add = tf.add(p, p)
    add1 = tf.add(p, p)
    add4 = tf.add(add, add1)
    add5 = tf.add(add4, add)
    out(add5)


@case("aggregation_addn", "AO TrivialSumsRepeatedAdd (its sum as one AddN)",
      "AddN(x, x, x, x) → Mul(x, 4): no AddN",
      absent("AddN"))
def _aggregation_addn(r):
    x = ph("input", [3, 4])
    out(tf.add_n([x, x, x, x]))


@case("add_ops_rewrite", "AO AddOpsRewrite_AddOpsOfIdenticalShape",
      "a + b + c of one shape → one AddN: 1 node adds",
      lambda h: h.get("Add", 0) + h.get("AddV2", 0) + h.get("AddN", 0) <= 1)
def _add_ops_rewrite(r):
    a, b, c = ph("a", [2, 2]), ph("b", [2, 2]), ph("c", [2, 2])
    out(tf.add(tf.add(a, b), c))


@case("split_one", "CF SplitRemoval",
      "Split into 1 → Identity: 1 Split left (of the 2-way one)",
      at_most(Split=1))
def _split_one(r):
    in1, in2 = ph("in1", [2]), ph("in2", [4])
    s1 = tf.split(in1, 1, axis=0)
    s2 = tf.split(in2, 2, axis=0)
    out(tf.add(s1[0], s2[0]))


@case("splitv_one", "CF SplitVRemoval",
      "SplitV into 1 → Identity: 1 SplitV left (of the 2-way one)",
      at_most(SplitV=1))
def _splitv_one(r):
    in1, in2 = ph("in1", [5]), ph("in2", [8])
    s1 = tf.raw_ops.SplitV(value=in1, size_splits=[5], axis=0, num_split=1)
    s2 = tf.raw_ops.SplitV(value=in2, size_splits=[3, 5], axis=0, num_split=2)
    out(tf.add(s1[0], s2[1]))


@case("merge_concat", "CF MergeConcat",
      "concat(concat(a, b), c) on one axis → concat(a, b, c): 1 ConcatV2",
      at_most(ConcatV2=1))
def _merge_concat(r):
    a, b, c = ph("a", [2, 2]), ph("b", [2, 2]), ph("c", [2, 2])
    out(tf.concat([tf.concat([a, b], 0), c], 0))


@case("transpose_matmul", "AO FoldTransposeIntoMatMul",
      "MatMul(Transpose(a), Transpose(b)) → MatMul(transpose_a, transpose_b): no Transpose",
      absent("Transpose"))
def _transpose_matmul(r):
    a, b = ph("a", [3, 2]), ph("b", [4, 3])
    out(tf.matmul(tf.transpose(a), tf.transpose(b)))


@case("identity_transposes", "AO RemoveIdentityTransposes",
      "Transpose(Transpose(x, p), inverse of p) removed: no Transpose",
      absent("Transpose"))
def _identity_transposes(r):
    x = ph("input", [2, 3, 4, 5])
    y = tf.transpose(tf.transpose(x, [0, 3, 1, 2]), [0, 2, 3, 1])
    out(tf.nn.relu(y))


@case("transpose_relu", "T2O test_transpose_relu",
      "Transpose → Relu → inverse Transpose: the transposes cancel, no Transpose",
      absent("Transpose"))
def _transpose_relu(r):
    x = ph("input", [2, 3, 4, 5])
    y = tf.nn.relu(tf.transpose(x, [0, 2, 3, 1]))
    out(tf.transpose(y, [0, 3, 1, 2]))


@case("transpose_concat", "T2O test_transpose_with_concat",
      "two Transposes into a Concat and back: 0 Transposes left (the concat axis moves)",
      absent("Transpose"))
def _transpose_concat(r):
    a, b = ph("a", [2, 3, 4, 5]), ph("b", [2, 3, 4, 5])
    y = tf.concat([tf.transpose(a, [0, 2, 3, 1]), tf.transpose(b, [0, 2, 3, 1])], axis=3)
    out(tf.transpose(y, [0, 3, 1, 2]))


@case("neutral_ones_like", "CF NeutralElement",
      "x * OnesLike(x) → x: no OnesLike, no Mul",
      absent("OnesLike", "Mul"))
def _neutral_ones_like(r):
    x = ph("input", [2, 3])
    y = tf.nn.relu(x)
    out(y * tf.raw_ops.OnesLike(x=y))     # tf.ones_like would fold to a Const


@case("neutral_zeros_like", "CF NeutralElement",
      "x + ZerosLike(x) → x: no ZerosLike, no Add",
      lambda h: all(h.get(op, 0) == 0 for op in ("ZerosLike", "Add", "AddV2")))
def _neutral_zeros_like(r):
    x = ph("input", [2, 3])
    y = tf.nn.relu(x)
    out(y + tf.raw_ops.ZerosLike(x=y))


@case("neutral_mul_ones", "CF NeutralElement",
      "x * ones and x + zeros (constants of x's shape) → x: no Mul, no Add",
      lambda h: all(h.get(op, 0) == 0 for op in ("Mul", "Add", "AddV2")))
def _neutral_mul_ones(r):
    x = ph("input", [2, 3])
    y = tf.nn.relu(x)
    out(y * tf.ones([2, 3]) + tf.zeros([2, 3]))


@case("tile_multiples_one", "CF TileWithMultipliesBeingOne",
      "Tile by all ones removed: no Tile",
      absent("Tile"))
def _tile_multiples_one(r):
    x = ph("input", [2, 3])
    out(tf.tile(tf.nn.relu(x), [1, 1]))


@case("transpose_size1", "CF TransposeOnSize1DimsRemoval",
      "Transpose that only moves size-1 dims removed: no Transpose",
      absent("Transpose"))
def _transpose_size1(r):
    x = ph("input", [1, 4, 1, 5])
    out(tf.transpose(x, [2, 1, 0, 3]) * 2.0)


@case("slice_same_dims", "CF SliceWithSameDimensionRemoval",
      "Slice and StridedSlice of the whole tensor removed: no Slice, no StridedSlice",
      absent("Slice", "StridedSlice"))
def _slice_same_dims(r):
    x = ph("input", [3, 5])
    a = tf.slice(x, [0, 0], [3, 5])
    b = tf.strided_slice(x, [0, 0], [3, 5])
    out(a * b)


@case("pad_zero_size", "CF PaddingWithZeroSize",
      "Pad by zeros removed: no Pad/PadV2",
      absent("Pad", "PadV2"))
def _pad_zero_size(r):
    x = ph("input", [2, 3])
    out(tf.pad(tf.nn.relu(x), [[0, 0], [0, 0]]))


@case("squeeze_no_op", "CF SqueezeWithAllDimensionsGreaterThanOne",
      "Squeeze of a tensor without size-1 dims removed: no Squeeze",
      absent("Squeeze"))
def _squeeze_no_op(r):
    x = ph("input", [2, 3])
    out(tf.squeeze(tf.nn.relu(x)))


@case("noop_reduction", "CF NoOpReduction",
      "Sum over size-1 dims with keep_dims removed: no Sum",
      absent("Sum"))
def _noop_reduction(r):
    x = ph("input", [3, 1, 4])
    out(tf.reduce_sum(tf.nn.relu(x), axis=[1], keepdims=True))


@case("reverse_size1", "CF ReverseOnSize1DimsRemoval",
      "ReverseV2 over size-1 dims removed: no ReverseV2",
      absent("ReverseV2"))
def _reverse_size1(r):
    x = ph("input", [1, 2, 1, 3])
    out(tf.reverse(tf.nn.relu(x), [0, 2]))


@case("stack_strided_slice", "AO RemoveStackStridedSliceSameAxis",
      "stack([a, b, c])[1] → b: no Pack, no StridedSlice",
      absent("Pack", "StridedSlice"))
def _stack_strided_slice(r):
    a, b, c = ph("a", [2, 3]), ph("b", [2, 3]), ph("c", [2, 3])
    out(tf.stack([a, b, c], axis=0)[1])


@case("constant_push_down", "CF ConstantPushDown",
      "c1 + (x + c2) → x + (c1 + c2): 1 Add",
      lambda h: h.get("Add", 0) + h.get("AddV2", 0) <= 1)
def _constant_push_down(r):
    x = ph("input", [2, 2])
    out(tf.add(const(r, [2, 2]), tf.add(x, const(r, [2, 2]))))


@case("mul_conv_push_down", "CF MulConvPushDown",
      "Mul(Conv2D(x, w), c) → Conv2D(x, w*c): no Mul",
      absent("Mul"))
def _mul_conv_push_down(r):
    x = ph("input", [1, 6, 6, 3])
    y = tf.nn.conv2d(x, conv_weights(r, [2, 2, 3, 4]), [1, 1, 1, 1], "VALID")
    out(y * const(r, [4]))


# ================================================================ fold constants (graph_transforms)
group("fold constants")


@case("fold_constants_simple_add", "GTC TestSimpleAdd",
      "a + b of constants folded; the placeholder and the output remain: 3 nodes",
      nodes_at_most(3))
def _fold_constants_simple_add(r):
    a, b = const(r, [100]), const(r, [100])
    placeholder = ph("placeholder_expect_remains", [100])
    tf.multiply(tf.add(a, b), placeholder, name="output_expect_remains")
    return ["output_expect_remains"]


# ================================================================ convolution forms
group("convolution forms")


@case("pad_valid_conv", "T2OB test_conv2d_with_pad_valid",
      "zero Pad → VALID Conv2D: the Pad becomes the conv's padding, no Pad",
      absent("Pad", "PadV2"))
def _pad_valid_conv(r):
    x = ph("input", [1, 6, 6, 3])
    y = tf.pad(x, [[0, 0], [1, 1], [2, 2], [0, 0]])
    out(tf.nn.conv2d(y, conv_weights(r, [3, 3, 3, 4]), [1, 1, 1, 1], "VALID"))


@case("pad_same_conv", "T2OB test_conv2d_with_pad_same",
      "zero Pad → SAME Conv2D: pads added into EXPLICIT padding, no Pad",
      absent("Pad", "PadV2"))
def _pad_same_conv(r):
    x = ph("input", [1, 6, 6, 3])
    y = tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]])
    out(tf.nn.conv2d(y, conv_weights(r, [3, 3, 3, 4]), [1, 1, 1, 1], "SAME"))


@case("scale_before_conv3d", "AO FoldMulToConv",
      "Mul(x, 1/255) → Conv3D: the scale folded into the weights, no Mul",
      absent("Mul"))
def _scale_before_conv3d(r):
    x = ph("inputs", [1, 8, 8, 8, 3])
    y = tf.multiply(x, tf.constant(1.0 / 255.0), name="scaled_inputs")
    conv = tf.nn.conv3d(y, conv_weights(r, [3, 3, 3, 3, 4]), [1, 1, 1, 1, 1], "VALID",
                        name="conv")
    tf.identity(conv, name="outputs")
    return ["outputs"]


@case("scale_after_conv3d", "AO FoldMulToConv (per-channel scale after)",
      "Conv3D → Mul(per-output-channel c): folded into the weights, no Mul",
      absent("Mul"))
def _scale_after_conv3d(r):
    x = ph("input", [1, 6, 6, 6, 3])
    y = tf.nn.conv3d(x, conv_weights(r, [3, 3, 3, 3, 4]), [1, 1, 1, 1, 1], "SAME")
    out(y * const(r, [4], 0.5, 1.5))


@case("scale_before_conv2d_transpose", "AO FoldMulToConv (Conv2DBackpropInput form)",
      "Mul(x, per-input-channel c) → Conv2DBackpropInput: folded into the filter, no Mul",
      absent("Mul"))
def _scale_before_conv2d_transpose(r):
    x = ph("input", [1, 4, 4, 3])
    y = x * const(r, [3], 0.5, 1.5)
    out(tf.compat.v1.nn.conv2d_transpose(y, conv_weights(r, [3, 3, 5, 3]), [1, 8, 8, 5],
                                         [1, 2, 2, 1], "SAME"))


@case("scale_after_conv2d_transpose", "CF MulConvPushDown (Conv2DBackpropInput form)",
      "Conv2DBackpropInput → Mul(per-output-channel c): folded into the filter, no Mul",
      absent("Mul"))
def _scale_after_conv2d_transpose(r):
    x = ph("input", [1, 4, 4, 3])
    y = tf.compat.v1.nn.conv2d_transpose(x, conv_weights(r, [3, 3, 5, 3]), [1, 8, 8, 5],
                                         [1, 2, 2, 1], "SAME")
    out(y * const(r, [5], 0.5, 1.5))


@case("transpose_scale_conv_nchw", "AO FoldMulToTransposeConv",
      "Mul(x, 1/255) → Transpose NHWC→NCHW → NCHW Conv2D: the scale folded, no Mul",
      absent("Mul"))
def _transpose_scale_conv_nchw(r):
    x = ph("inputs", [1, 12, 12, 3])
    y = tf.multiply(x, tf.constant(1.0 / 255.0), name="scaled_inputs")
    y = tf.transpose(y, [0, 3, 1, 2], name="inputs_nchw")
    conv = tf.nn.conv2d(y, conv_weights(r, [5, 5, 3, 4]), [1, 1, 1, 1], "VALID",
                        data_format="NCHW", name="conv")
    tf.identity(conv, name="outputs")
    return ["outputs"]


def _atrous_block(r, depthwise: bool):
    x = ph("input_op", [1, 3, 3, 2])
    block = tf.constant([2, 2], name="block_shape_op")
    y = tf.raw_ops.SpaceToBatchND(input=x, block_shape=block,
                                  paddings=tf.constant([[1, 2], [1, 2]], name="paddings_op"))
    weights = tf.constant(r.standard_normal([2, 2, 2, 1]).astype(np.float32), name="weights_op")
    if depthwise:
        y = tf.raw_ops.DepthwiseConv2dNative(input=y, filter=weights, strides=[1, 1, 1, 1],
                                             padding="VALID", name="conv_op")
    else:
        y = tf.raw_ops.Conv2D(input=y, filter=weights, strides=[1, 1, 1, 1], padding="VALID",
                              name="conv_op")
    tf.raw_ops.BatchToSpaceND(input=y, block_shape=block,
                              crops=tf.constant([[0, 1], [0, 1]], name="crops_op"),
                              name="output")


@case("atrous_conv2d", "GTA TestFlattenAtrousConv2D",
      "SpaceToBatchND → Conv2D → BatchToSpaceND → one dilated Conv2D: 3 nodes",
      all_of(nodes_at_most(3), absent("SpaceToBatchND", "BatchToSpaceND")))
def _atrous_conv2d(r):
    _atrous_block(r, depthwise=False)


@case("atrous_depthwise", "GTA TestFlattenAtrousDepthwiseConv2dNative",
      "SpaceToBatchND → DepthwiseConv2dNative → BatchToSpaceND → one dilated depthwise: 3 nodes",
      all_of(nodes_at_most(3), absent("SpaceToBatchND", "BatchToSpaceND")))
def _atrous_depthwise(r):
    _atrous_block(r, depthwise=True)


@case("atrous_tf1_same", "T2OB test_conv2d_dilations_rewriter",
      "tf.compat.v1.nn.atrous_conv2d (rate 2, SAME) → one Conv2D with dilations: no "
      "SpaceToBatchND/BatchToSpaceND",
      absent("SpaceToBatchND", "BatchToSpaceND"))
def _atrous_tf1_same(r):
    x = ph("input", [1, 9, 9, 3])
    out(tf.compat.v1.nn.atrous_conv2d(x, conv_weights(r, [3, 3, 3, 4]), rate=2, padding="SAME"))


@case("atrous_tf1_depthwise_valid", "T2OB test_conv2d_dilations_rewriter (depthwise)",
      "tf.compat.v1.nn.depthwise_conv2d rate 2, VALID → one dilated depthwise: no "
      "SpaceToBatchND/BatchToSpaceND",
      absent("SpaceToBatchND", "BatchToSpaceND"))
def _atrous_tf1_depthwise_valid(r):
    x = ph("input", [1, 10, 10, 3])
    out(tf.compat.v1.nn.depthwise_conv2d(x, conv_weights(r, [3, 3, 3, 2]), [1, 1, 1, 1],
                                         "VALID", rate=[2, 2]))


def _fuse_input(r):
    return ph("input_op", [1, 2, 3, 2])


def _fuse_weights(r):
    return tf.constant(r.standard_normal([1, 2, 2, 2]).astype(np.float32), name="weights_op")


@case("fuse_pad_conv", "GTF TestFusePadAndConv",
      "MirrorPad(REFLECT) → Conv2D fused: no MirrorPad, no Conv2D (one FusedPadConv2D)",
      absent("MirrorPad", "Conv2D"))
def _fuse_pad_conv(r):
    x = _fuse_input(r)
    y = tf.raw_ops.MirrorPad(input=x, paddings=[[0, 0], [1, 1], [2, 2], [0, 0]], mode="REFLECT")
    tf.nn.conv2d(y, _fuse_weights(r), [1, 1, 1, 1], "VALID", name="output")


@case("fuse_resize_conv", "GTF TestFuseResizeAndConv",
      "ResizeBilinear → Conv2D fused: no ResizeBilinear, no Conv2D (one FusedResizeAndPadConv2D)",
      absent("ResizeBilinear", "Conv2D"))
def _fuse_resize_conv(r):
    x = _fuse_input(r)
    y = tf.compat.v1.image.resize_bilinear(x, [12, 4], align_corners=False)
    tf.nn.conv2d(y, _fuse_weights(r), [1, 1, 1, 1], "VALID", name="output")


@case("fuse_resize_pad_conv", "GTF TestFuseResizePadAndConv",
      "ResizeBilinear → MirrorPad → Conv2D fused: none of the three left",
      absent("ResizeBilinear", "MirrorPad", "Conv2D"))
def _fuse_resize_pad_conv(r):
    x = _fuse_input(r)
    y = tf.compat.v1.image.resize_bilinear(x, [12, 4], align_corners=False)
    y = tf.raw_ops.MirrorPad(input=y, paddings=[[0, 0], [1, 1], [2, 2], [0, 0]], mode="REFLECT")
    tf.nn.conv2d(y, _fuse_weights(r), [1, 1, 1, 1], "VALID", name="output")
