"""remove-noop-shape-ops (issue 23): each rule on a graph with random values — the op gone, the
numbers identical bit for bit (NaN, ±Inf and -0 fed too) by the tests' own oracle (original and
result in plain TF sessions) — and its refusals: unknown shapes, ops that do change the tensor,
inner ops read elsewhere, graph outputs keeping their names."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

import oracle
from conftest import ops, optimize, property_examples, report_of
from tfsurgery.contract import Options
from tfsurgery.graph import Graph
from tfsurgery.models.common import BuiltModel
from tfsurgery.transforms.remove_noop_shape_ops import remove_noop_shape_ops

R = np.random.default_rng(2023)
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], np.float32)
RULE = "remove-noop-shape-ops"


def build(body, shape=(2, 1, 3), dtype=tf.float32, output="output"):
    """One input ``in0`` of ``shape`` (None: unknown rank), ``body(x)`` as the output. With
    ``output=None`` the body names its own output node "output"."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(dtype, shape, name="in0")
        y = body(x)
        if output:
            tf.identity(y, name=output)
    return BuiltModel(graph.as_graph_def(), ["in0"], ["output"])


def feeds(shape, dtype=np.float32):
    shape = [2 if d is None else d for d in (shape or (2, 1, 3))]
    if dtype == np.bool_:
        return {"in0": R.integers(0, 2, size=shape).astype(bool)}
    value = R.standard_normal(shape).astype(dtype)
    flat = value.reshape(-1)
    count = min(SPECIAL.size, flat.size)
    flat[:count] = R.permutation(SPECIAL)[:count]
    return {"in0": value}


def same_bits(result, shape, dtype=np.float32):
    """The oracle: the original and the result in plain sessions on the same feeds, bit for bit
    (zeros' signs and NaN places too)."""
    built = result.test_model
    given = feeds(shape, dtype)
    (before,) = oracle.run(built.graph_def, given, built.outputs)
    (after,) = oracle.run(result.graph_def, given, result.outputs)
    assert before.shape == after.shape and before.dtype == after.dtype
    assert np.array_equal(before, after, equal_nan=before.dtype.kind == "f"), (before, after)
    if before.dtype.kind == "f":
        numbers = ~np.isnan(before)
        assert np.array_equal(np.signbit(before[numbers]), np.signbit(after[numbers]))


def simplified(built, **kwargs):
    result = optimize(built, bn_fold=False, exact=True, **kwargs)
    return result, ops(result.graph_def)


ZEROS = [[0, 0], [0, 0], [0, 0]]

# name → (body, input shape, the op that must be gone)
NO_OPS = {
    "tile by ones": (lambda x: tf.tile(x, [1, 1, 1]), (2, 1, 3), "Tile"),
    "tile by ones, unknown batch": (lambda x: tf.tile(x, [1, 1, 1]), (None, 1, 3), "Tile"),
    "pad by zeros": (lambda x: tf.pad(x, ZEROS), (2, 1, 3), "Pad"),
    "padv2 by zeros": (lambda x: tf.raw_ops.PadV2(input=x, paddings=ZEROS,
                                                  constant_values=7.0), (2, 1, 3), "PadV2"),
    "mirror pad by zeros": (lambda x: tf.raw_ops.MirrorPad(input=x, paddings=ZEROS,
                                                           mode="REFLECT"), (2, 1, 3),
                            "MirrorPad"),
    "slice of it all": (lambda x: tf.slice(x, [0, 0, 0], [2, 1, 3]), (2, 1, 3), "Slice"),
    "slice by -1, unknown batch": (lambda x: tf.slice(x, [0, 0, 0], [-1, 1, -1]), (None, 1, 3),
                                   "Slice"),
    "strided slice of it all": (lambda x: tf.strided_slice(x, [0, 0, 0], [2, 1, 3]), (2, 1, 3),
                                "StridedSlice"),
    "strided slice past the end": (lambda x: x[0:5, :, 0:100], (2, 1, 3), "StridedSlice"),
    "strided slice by masks, unknown batch": (lambda x: x[:, :], (None, 1, 3), "StridedSlice"),
    "sum over a size-1 dim": (lambda x: tf.reduce_sum(x, axis=1, keepdims=True), (2, 1, 3),
                              "Sum"),
    "mean over size-1 dims": (lambda x: tf.reduce_mean(x, axis=[0, -2], keepdims=True),
                              (1, 1, 3), "Mean"),
    "max over a size-1 dim": (lambda x: tf.reduce_max(x, axis=[1], keepdims=True), (2, 1, 3),
                              "Max"),
    "min over a size-1 dim": (lambda x: tf.reduce_min(x, axis=[1], keepdims=True), (2, 1, 3),
                              "Min"),
    "prod over a size-1 dim": (lambda x: tf.reduce_prod(x, axis=[1], keepdims=True),
                               (None, 1, 3), "Prod"),
    "sum over no axis": (lambda x: tf.raw_ops.Sum(input=x, axis=tf.constant([], tf.int32)),
                         (2, 1, 3), "Sum"),
    "reverse over a size-1 dim": (lambda x: tf.reverse(x, [1]), (2, 1, 3), "ReverseV2"),
    "reverse (v1) over a size-1 dim": (lambda x: tf.raw_ops.Reverse(
        tensor=x, dims=[False, True, False]), (None, 1, 3), "Reverse"),
    "transpose of size-1 dims, same shape": (lambda x: tf.transpose(x, [2, 1, 0, 3]),
                                             (1, 4, 1, 5), "Transpose"),
    "transpose of size-1 dims → reshape": (lambda x: tf.transpose(x, [1, 0, 2]), (2, 1, 3),
                                           "Transpose"),
    "transpose of size-1 dims, unknown batch": (lambda x: tf.transpose(x, [1, 0, 2]),
                                                (None, 1, 3), "Transpose"),
    "concat of a concat": (lambda x: tf.concat([tf.concat([x, x * 2.0], 2), x * 3.0], 2),
                           (2, 1, 3), None),
    "concat of a concat, axes -1 and 2": (
        lambda x: tf.concat([x * 3.0, tf.concat([x, x * 2.0], -1)], 2), (2, 1, 3), None),
    "stack then pick": (lambda x: tf.stack([x, x * 2.0, x * 3.0])[1], (2, 1, 3), "Pack"),
    "stack then pick the last": (lambda x: tf.stack([x, x * 2.0, x * 3.0])[-1], (2, 1, 3),
                                 "Pack"),
    "stack on axis 1 then pick": (lambda x: tf.stack([x, x * 2.0], axis=1)[:, 0], (None, 1, 3),
                                  "Pack"),
}


@pytest.mark.parametrize("name", sorted(NO_OPS))
def test_a_no_op_goes_bit_exactly(name):
    body, shape, gone = NO_OPS[name]
    result, kept = simplified(build(body, shape))
    if gone is None:                                    # concat of concat: one concat left
        assert kept.count("ConcatV2") == 1, kept
    else:
        assert gone not in kept and "StridedSlice" not in kept, kept
    assert report_of(result, RULE).rewritten
    same_bits(result, shape)


def test_a_transpose_of_size_1_dims_becomes_a_reshape_without_a_node_more():
    built = build(lambda x: tf.transpose(x, [1, 0, 2]) * 2.0, (None, 1, 3))
    result, kept = simplified(built)
    assert "Transpose" not in kept and kept.count("Reshape") == 1, kept
    assert len(result.graph_def.node) == len(built.graph_def.node)
    same_bits(result, (None, 1, 3))


def test_bool_reductions_over_a_size_1_dim_go():
    body = lambda x: tf.logical_and(tf.reduce_any(x, axis=1, keepdims=True),     # noqa: E731
                                    tf.reduce_all(x, axis=1, keepdims=True))
    result, kept = simplified(build(body, (2, 1, 3), tf.bool))
    assert "Any" not in kept and "All" not in kept, kept
    same_bits(result, (2, 1, 3), np.bool_)


# ---------------------------------------------------------------- refusals
NOT_NO_OPS = {
    "tile by two": (lambda x: tf.tile(x, [2, 1, 1]), (2, 1, 3), "Tile"),
    "pad by one": (lambda x: tf.pad(x, [[0, 0], [1, 0], [0, 0]]), (2, 1, 3), "Pad"),
    "slice from 1": (lambda x: tf.slice(x, [1, 0, 0], [-1, -1, -1]), (2, 1, 3), "Slice"),
    "slice short": (lambda x: tf.slice(x, [0, 0, 0], [2, 1, 2]), (2, 1, 3), "Slice"),
    "strided slice by 2": (lambda x: x[::2], (2, 1, 3), "StridedSlice"),
    "strided slice to -1": (lambda x: x[:, :, 0:-1], (2, 1, 3), "StridedSlice"),
    "strided slice that shrinks": (lambda x: x[:, 0], (2, 1, 3), "StridedSlice"),
    "sum over a size-3 dim": (lambda x: tf.reduce_sum(x, axis=2, keepdims=True), (2, 1, 3),
                              "Sum"),
    "sum dropping the size-1 dim": (lambda x: tf.reduce_sum(x, axis=1), (2, 1, 3), "Sum"),
    "euclidean norm over a size-1 dim": (lambda x: tf.norm(x, axis=1, keepdims=True),
                                         (2, 1, 3), "Sqrt"),
    "reverse over a size-3 dim": (lambda x: tf.reverse(x, [2]), (2, 1, 3), "ReverseV2"),
    "transpose of real dims": (lambda x: tf.transpose(x, [2, 1, 0]), (2, 1, 3), "Transpose"),
    "concat on another axis": (lambda x: tf.concat([tf.concat([x, x * 2.0], 0),
                                                    tf.concat([x * 3.0, x], 0)], 2),
                               (2, 1, 3), "ConcatV2"),
    "stack then slice a range": (lambda x: tf.stack([x, x * 2.0])[0:1], (2, 1, 3), "Pack"),
    "stack then pick on another axis": (lambda x: tf.stack([x, x * 2.0])[:, 0], (2, 1, 3),
                                        "Pack"),
}


@pytest.mark.parametrize("name", sorted(NOT_NO_OPS))
def test_an_op_that_changes_the_tensor_stays(name):
    body, shape, kept_op = NOT_NO_OPS[name]
    result, kept = simplified(build(body, shape))
    assert kept_op in kept, kept
    same_bits(result, shape)


UNKNOWN = {
    "tile by ones, unknown rank": (lambda x: tf.tile(x, [1, 1, 1]), "Tile"),
    "pad by zeros, unknown rank": (lambda x: tf.pad(x, ZEROS), "Pad"),
    "slice, unknown rank": (lambda x: tf.slice(x, [0, 0, 0], [2, 1, 3]), "Slice"),
    "sum, unknown rank": (lambda x: tf.reduce_sum(x, axis=1, keepdims=True), "Sum"),
    "reverse, unknown rank": (lambda x: tf.reverse(x, [1]), "ReverseV2"),
    "transpose, unknown rank": (lambda x: tf.transpose(x, [1, 0, 2]), "Transpose"),
}


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_an_unknown_rank_is_refused_and_said(name):
    body, kept_op = UNKNOWN[name]
    result, kept = simplified(build(body, None), verify=False)   # the oracle feeds [2, 1, 3]
    assert kept_op in kept, kept
    assert any("not known" in why for _, why in report_of(result, RULE).skipped)
    same_bits(result, (2, 1, 3))


UNKNOWN_DIM = {
    "slice to an unknown dim's size": (lambda x: tf.slice(x, [0, 0, 0], [2, 1, 3]), "Slice"),
    "strided slice to an unknown dim's end": (lambda x: tf.strided_slice(x, [0, 0, 0],
                                                                         [2, 1, 3]),
                                              "StridedSlice"),
    "sum over an unknown dim": (lambda x: tf.reduce_sum(x, axis=0, keepdims=True), "Sum"),
    "reverse over an unknown dim": (lambda x: tf.reverse(x, [0]), "ReverseV2"),
}


@pytest.mark.parametrize("name", sorted(UNKNOWN_DIM))
def test_an_unknown_dim_the_rule_needs_is_refused(name):
    body, kept_op = UNKNOWN_DIM[name]
    result, kept = simplified(build(body, (None, 1, 3)))
    assert kept_op in kept, kept
    assert any("not known" in why for _, why in report_of(result, RULE).skipped)
    same_bits(result, (None, 1, 3))


def test_an_inner_concat_read_elsewhere_stays():
    def body(x):
        inner = tf.concat([x, x * 2.0], 2)
        return tf.concat([inner, x], 2) * tf.reduce_sum(inner)
    result, kept = simplified(build(body))
    assert kept.count("ConcatV2") == 2, kept
    same_bits(result, (2, 1, 3))


@pytest.mark.parametrize("op", ["tile", "pad", "reverse", "stack"])
def test_a_graph_output_keeps_its_name(op):
    forms = {"tile": lambda x: tf.tile(x, [1, 1, 1], name="output"),
             "pad": lambda x: tf.pad(x, ZEROS, name="output"),
             "reverse": lambda x: tf.reverse(x, [1], name="output"),
             "stack": lambda x: tf.strided_slice(tf.stack([x * 2.0, x]), [1], [2],
                                                 shrink_axis_mask=1, name="output")}
    result, kept = simplified(build(forms[op], output=None))
    node = next(n for n in result.graph_def.node if n.name == "output")
    assert node.op == "Identity", node
    assert result.outputs == ["output"]
    same_bits(result, (2, 1, 3))


@pytest.mark.parametrize("on", ["the tile", "its multiples"])
def test_a_no_op_with_a_control_input_stays(on):
    """The transform alone (the pipeline drops a bare NoOp's control edge first)."""
    def body(x):
        tf.raw_ops.NoOp(name="before")
        return tf.tile(x, [1, 1, 1], name="tiled")
    graph_def = build(body).graph_def
    holder = next(n for n in graph_def.node
                  if n.name == ("tiled" if on == "the tile" else "tiled/multiples"))
    holder.input.append("^before")
    graph = Graph(graph_def)
    remove_noop_shape_ops(graph, Options(inputs=["in0"], outputs=["output"]))
    assert graph.op("tiled") == "Tile"


# ---------------------------------------------------------------- random chains of no-ops
CHAIN = {
    "tile": lambda x: tf.tile(x, [1, 1, 1]),
    "pad": lambda x: tf.pad(x, ZEROS),
    "slice": lambda x: tf.slice(x, [0, 0, 0], [-1, 1, -1]),
    "strided": lambda x: x[:, :, 0:3],
    "sum": lambda x: tf.reduce_sum(x, axis=1, keepdims=True),
    "max": lambda x: tf.reduce_max(x, axis=-2, keepdims=True),
    "reverse": lambda x: tf.reverse(x, [-2]),
    "transpose": lambda x: tf.transpose(tf.transpose(x, [1, 0, 2]), [1, 0, 2]),
    "stack": lambda x: tf.stack([x * 0.5, x, x * 2.0], axis=2)[:, :, 1],
}


@settings(max_examples=property_examples(default=15), deadline=None)
@given(st.lists(st.sampled_from(sorted(CHAIN)), min_size=1, max_size=5), st.booleans())
def test_random_chains_of_no_ops_vanish_and_keep_the_bits(chain, batch_known):
    shape = (2 if batch_known else None, 1, 3)

    def body(x):
        for rule in chain:
            x = tf.nn.relu(CHAIN[rule](x)) - 0.5
        return x
    result, kept = simplified(build(body, shape))
    left = set(kept) & {"Tile", "Pad", "Slice", "StridedSlice", "Sum", "Max", "ReverseV2",
                        "Transpose", "Pack"}
    assert not left, (chain, kept)
    same_bits(result, shape)
