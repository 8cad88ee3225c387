"""simplify-algebra (issue 23): each rule on a graph with random values — the op gone, the numbers
checked by the tests' own oracle (bit for bit where the rule is exact, NaN, Inf and -0 fed too) —
a refusal per rule where it must not apply, --exact, random chains of the rules, and
merge-duplicates on by default (a duplicated conv branch)."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

import oracle
from conftest import assert_matches, ops, optimize, property_examples, report_of, source_of
from tfsurgery import api
from tfsurgery.models.common import BuiltModel

R = np.random.default_rng(23)
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], np.float32)


def build(body, dtype=tf.float32, shape=(3, 4), inputs=2):
    with tf.Graph().as_default() as graph:
        xs = [tf.compat.v1.placeholder(dtype, shape, name=f"in{i}") for i in range(inputs)]
        tf.identity(body(*xs), name="output")
    return BuiltModel(graph.as_graph_def(), [f"in{i}" for i in range(inputs)], ["output"])


def feeds(built, dtype=np.float32, special=True):
    out = {}
    for name in built.inputs:
        shape = [d.size if d.size >= 0 else 2 for d in next(
            n for n in built.graph_def.node if n.name == name).attr["shape"].shape.dim]
        if np.dtype(dtype).kind in "iu":
            value = R.integers(-5, 5, size=shape).astype(dtype)
        elif np.dtype(dtype).kind == "c":
            value = (R.standard_normal(shape) + 1j * R.standard_normal(shape)).astype(dtype)
        else:
            value = R.standard_normal(shape).astype(dtype)
            if special:             # NaN, ±Inf, ±0 where an exact rule must keep them exactly
                flat = value.reshape(-1)
                count = min(SPECIAL.size, flat.size)
                flat[:count] = R.permutation(SPECIAL)[:count]
        out[name] = value
    return out


def same_bits(result, dtype=np.float32, special=True, exact=True):
    """The oracle: original and result in plain sessions on the same feeds — identical bits
    (signed zeros and NaN places too) when ``exact``, else equal within float32 rounding."""
    built = result.test_model
    given = feeds(built, dtype, special)
    (before,) = oracle.run(built.graph_def, given, built.outputs)
    (after,) = oracle.run(result.graph_def, given, result.outputs)
    assert before.shape == after.shape and before.dtype == after.dtype
    if exact:
        assert np.array_equal(before, after, equal_nan=True), (before, after)
        if before.dtype.kind == "f":        # zeros' signs too (a NaN's sign means nothing)
            numbers = ~np.isnan(before)
            assert np.array_equal(np.signbit(before[numbers]), np.signbit(after[numbers]))
    else:
        np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)


def simplified(built, **kwargs):
    result = optimize(built, bn_fold=False, **kwargs)
    return result, ops(result.graph_def)


# ---------------------------------------------------------------- exact rules
@pytest.mark.parametrize("form, expected", [
    (lambda x, y: x + (-y), "Sub"),
    (lambda x, y: tf.add(tf.negative(x), y), "Sub"),
    (lambda x, y: x - (-y), "AddV2"),
])
def test_negation_forms_become_one_op_bit_exactly(form, expected):
    result, kept = simplified(build(form))
    assert "Neg" not in kept and expected in kept, kept
    assert report_of(result, "simplify-algebra").rewritten
    same_bits(result)


@pytest.mark.parametrize("compare", ["less", "less_equal", "greater", "greater_equal",
                                     "equal", "not_equal"])
def test_not_of_an_integer_comparison_is_the_opposite_comparison(compare):
    result, kept = simplified(build(lambda a, b: tf.logical_not(getattr(tf.math, compare)(a, b)),
                                    dtype=tf.int32))
    assert "LogicalNot" not in kept, kept
    same_bits(result, np.int32)


@pytest.mark.parametrize("compare", ["less", "less_equal", "greater", "greater_equal"])
def test_not_of_a_float_comparison_is_refused_nan_would_flip(compare):
    result, kept = simplified(build(lambda a, b: tf.logical_not(getattr(tf.math, compare)(a, b))))
    assert "LogicalNot" in kept
    assert any("NaN" in why for _, why in report_of(result, "simplify-algebra").skipped)
    same_bits(result)


def test_not_of_float_equality_is_not_equal_nan_included():
    result, kept = simplified(build(lambda a, b: tf.logical_not(tf.equal(a, b))))
    assert "LogicalNot" not in kept and "NotEqual" in kept, kept
    same_bits(result)


def test_logical_not_twice_goes():
    built = build(lambda a, b: tf.logical_not(tf.logical_not(a < b)), dtype=tf.int32)
    result, kept = simplified(built)
    assert "LogicalNot" not in kept, kept
    same_bits(result, np.int32)


def test_conj_twice_goes():
    result, kept = simplified(build(lambda a, b: tf.raw_ops.Conj(input=tf.raw_ops.Conj(input=a))
                                    * b, dtype=tf.complex64))
    assert "Conj" not in kept, kept
    same_bits(result, np.complex64)


def test_a_sum_of_one_tensor_with_itself_stays_where_doubling_gains_nothing():
    """p + p → p * 2 would cost a constant node more: merged, and kept as p + p."""
    result, kept = simplified(build(lambda x, y: tf.add(tf.nn.relu(x), tf.nn.relu(x)) - y))
    assert kept.count("AddV2") == 1 and kept.count("Relu") == 1 and "Mul" not in kept, kept
    same_bits(result)


def test_a_doubling_scaled_by_a_constant_is_one_product_unless_exact():
    c = R.uniform(0.5, 1.5, 4).astype(np.float32)
    form = lambda x, y: tf.constant(c) * tf.add(tf.nn.relu(x), tf.nn.relu(x)) - y  # noqa: E731
    result, kept = simplified(build(form))
    assert "AddV2" not in kept and kept.count("Mul") == 1 and kept.count("Const") == 1, kept
    same_bits(result, special=False, exact=False)
    result, kept = simplified(build(form), exact=True)
    assert kept.count("AddV2") == 1 and kept.count("Mul") == 1, kept
    same_bits(result)


def test_commutative_operands_in_either_order_merge():
    form = lambda x, y: tf.add(x, y) * tf.add(y, x) + tf.multiply(y, x) * tf.multiply(x, y)  # noqa
    result, kept = simplified(build(form), exact=True)
    assert kept.count("AddV2") == 2 and kept.count("Mul") == 3, kept
    same_bits(result)


def test_maximum_is_never_merged_with_its_operands_swapped_nan_order_matters():
    form = lambda x, y: tf.maximum(x, y) - tf.maximum(y, x)      # noqa: E731
    result, kept = simplified(build(form))
    assert kept.count("Maximum") == 2, kept
    same_bits(result)


def test_involution_around_a_value_preserving_chain_goes():
    def form(x, y):
        z = tf.transpose(tf.reshape(tf.identity(tf.negative(x)), [4, 3]))
        return tf.negative(z) * y
    result, kept = simplified(build(form), exact=True)
    assert "Neg" not in kept and "Transpose" in kept, kept
    same_bits(result)


def test_reciprocal_around_a_squeeze_goes_unless_exact():
    def form(x, y):
        z = tf.squeeze(tf.identity(tf.math.reciprocal(tf.expand_dims(x, 1))), axis=[1])
        return tf.math.reciprocal(z) * y
    result, kept = simplified(build(form))
    assert "Reciprocal" not in kept, kept
    same_bits(result, special=False, exact=False)
    result, kept = simplified(build(form), exact=True)
    assert kept.count("Reciprocal") == 2, kept
    same_bits(result)


def test_involution_around_a_chain_read_elsewhere_is_refused():
    def form(x, y):
        inner = tf.squeeze(tf.math.reciprocal(tf.expand_dims(x, 1)), axis=[1])
        return tf.math.reciprocal(inner) * y + inner       # the chain is needed as it is
    result, kept = simplified(build(form))
    assert kept.count("Reciprocal") == 2, kept
    same_bits(result, special=False)


def test_a_common_divisor_is_hoisted_unless_exact():
    form = lambda x, y: x / y + (x * 0.5) / y      # noqa: E731
    result, kept = simplified(build(form))
    assert kept.count("RealDiv") == 1, kept
    same_bits(result, special=False, exact=False)
    assert "reassociated" in " ".join(report_of(result, "simplify-algebra").notes)
    result, kept = simplified(build(form), exact=True)
    assert kept.count("RealDiv") == 2, kept
    same_bits(result)


def test_an_integer_common_divisor_is_refused_division_truncates():
    form = lambda x, y: tf.math.floordiv(x, y) + tf.math.floordiv(x * 3, y)    # noqa: E731
    built = build(lambda x, y: tf.raw_ops.Div(x=x, y=y * 0 + 7) + tf.raw_ops.Div(x=x * 3,
                                                                            y=y * 0 + 7),
                  dtype=tf.int32)
    result, kept = simplified(built)
    assert kept.count("Div") == 2, kept
    same_bits(result, np.int32)
    del form


@pytest.mark.parametrize("op", ["add", "multiply"])
def test_constants_are_pushed_down_into_one_unless_exact(op):
    c1, c2 = (R.uniform(0.5, 1.5, 4).astype(np.float32) for _ in range(2))
    f = getattr(tf, op)
    form = lambda x, y: f(tf.constant(c1), f(x, tf.constant(c2))) - y     # noqa: E731
    result, kept = simplified(build(form))
    assert kept.count("Const") == 1, kept
    same_bits(result, special=False, exact=False)
    result, kept = simplified(build(form), exact=True)
    assert kept.count("Const") == 2, kept
    same_bits(result)


def test_integer_constants_are_pushed_down_even_exact():
    form = lambda x, y: tf.add(tf.constant(2**31 - 5), tf.add(x, tf.constant(9))) * y   # noqa
    result, kept = simplified(build(form, dtype=tf.int32), exact=True)
    assert kept.count("Const") == 1 and kept.count("AddV2") == 1, kept      # wraps as TF does
    same_bits(result, np.int32)


def test_push_down_refused_when_the_combined_constant_would_be_larger():
    c1, c2 = R.standard_normal((3, 1)).astype(np.float32), R.standard_normal(4).astype(np.float32)
    form = lambda x, y: (tf.constant(c1) + (x + tf.constant(c2))) * y      # noqa: E731
    result, kept = simplified(build(form))
    assert kept.count("AddV2") == 2, kept                  # [3, 1] + [4] would be [3, 4]
    same_bits(result)


def test_push_down_refused_when_the_inner_sum_is_read_elsewhere():
    c1, c2 = (R.standard_normal(4).astype(np.float32) for _ in range(2))

    def form(x, y):
        inner = x + tf.constant(c2)
        return (tf.constant(c1) + inner) * inner
    result, kept = simplified(build(form))
    assert kept.count("AddV2") == 2, kept
    same_bits(result, special=False)


def test_a_tree_of_sums_is_one_addn_unless_exact():
    form = lambda x, y: (x + y) + (y * 2.0 + x)      # noqa: E731
    result, kept = simplified(build(form))
    assert kept.count("AddN") == 1 and "AddV2" not in kept, kept
    same_bits(result, special=False, exact=False)
    result, kept = simplified(build(form), exact=True)
    assert "AddN" not in kept and kept.count("AddV2") == 3, kept
    same_bits(result)


def test_a_tree_of_sums_that_broadcasts_is_refused():
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, (3, 4), name="in0")
        y = tf.compat.v1.placeholder(tf.float32, (4,), name="in1")
        tf.identity((x + y) + x, name="output")              # y broadcasts: AddN would not
    result, kept = simplified(BuiltModel(graph.as_graph_def(), ["in0", "in1"], ["output"]))
    assert "AddN" not in kept and kept.count("AddV2") == 2, kept
    assert any("AddN" in why for _, why in report_of(result, "simplify-algebra").skipped)
    same_bits(result)


@pytest.mark.parametrize("op", ["Split", "SplitV"])
def test_split_into_one_piece_is_its_input(op):
    def form(x, y):
        if op == "Split":
            piece = tf.raw_ops.Split(axis=1, value=x, num_split=1)[0]
        else:
            piece = tf.raw_ops.SplitV(value=x, size_splits=[4], axis=1, num_split=1)[0]
        return piece * y
    result, kept = simplified(build(form))
    assert op not in kept, kept
    same_bits(result)


@pytest.mark.parametrize("side", ["a", "b", "both"])
def test_transpose_feeding_matmul_becomes_its_flag(side):
    def form(x, y):
        a = tf.transpose(x) if side in ("a", "both") else tf.reshape(x, [4, 3])
        b = tf.transpose(tf.reshape(y, [4, 3]), [1, 0]) if side == "both" else \
            tf.transpose(y, [1, 0]) if side == "b" else tf.reshape(y, [3, 4])
        return tf.matmul(a, b, transpose_a=side == "b")      # b: [4, 3]ᵀ·[4, 3]ᵀ
    result, kept = simplified(build(form, shape=(3, 4)))
    assert "Transpose" not in kept, kept
    same_bits(result, special=False)


def test_transpose_of_last_two_axes_feeding_batch_matmul_becomes_adj():
    form = lambda x, y: tf.matmul(tf.transpose(x, [0, 2, 1]), y)     # noqa: E731
    result, kept = simplified(build(form, shape=(2, 3, 3)))
    assert "Transpose" not in kept and "BatchMatMulV2" in kept, kept
    same_bits(result, special=False)


def test_transpose_into_complex_batch_matmul_is_refused_adj_conjugates():
    form = lambda x, y: tf.matmul(tf.transpose(x, [0, 2, 1]), y)     # noqa: E731
    result, kept = simplified(build(form, dtype=tf.complex64, shape=(2, 3, 3)))
    assert "Transpose" in kept
    same_bits(result, np.complex64)


def test_a_transpose_of_other_axes_stays():
    form = lambda x, y: tf.matmul(tf.transpose(x, [1, 0, 2]), y)     # noqa: E731
    result, kept = simplified(build(form, shape=(3, 3, 3)))
    assert "Transpose" in kept
    same_bits(result, special=False)


def test_times_ones_like_itself_goes():
    result, kept = simplified(build(lambda x, y: (x * tf.raw_ops.OnesLike(x=x)) - y))
    assert "OnesLike" not in kept and "Mul" not in kept, kept
    same_bits(result)


def test_ones_like_of_a_tensor_that_may_broadcast_is_refused():
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, (4,), name="in0")
        z = tf.compat.v1.placeholder(tf.float32, (3, 4), name="in1")
        tf.identity(x * tf.raw_ops.OnesLike(x=z), name="output")     # broadcasts x to [3, 4]
    result, kept = simplified(BuiltModel(graph.as_graph_def(), ["in0", "in1"], ["output"]))
    assert "OnesLike" in kept
    assert report_of(result, "simplify-algebra").skipped
    same_bits(result)


def test_plus_zeros_like_itself_goes_for_integers_even_exact():
    result, kept = simplified(build(lambda x, y: (x + tf.raw_ops.ZerosLike(x=x)) * y,
                                    dtype=tf.int32), exact=True)
    assert "ZerosLike" not in kept, kept
    same_bits(result, np.int32)


# ---------------------------------------------------------------- not bit-exact: off with --exact
def test_plus_zeros_like_of_floats_goes_unless_exact():
    form = lambda x, y: (x + tf.raw_ops.ZerosLike(x=x)) * y       # noqa: E731
    result, kept = simplified(build(form))
    assert "ZerosLike" not in kept, kept
    same_bits(result, special=False)
    assert "reassociated" in " ".join(report_of(result, "simplify-algebra").notes)
    result, kept = simplified(build(form), exact=True)
    assert "ZerosLike" in kept
    same_bits(result)


def test_reciprocal_twice_goes_unless_exact():
    form = lambda x, y: tf.math.reciprocal(tf.math.reciprocal(x)) * y    # noqa: E731
    result, kept = simplified(build(form))
    assert "Reciprocal" not in kept, kept
    same_bits(result, special=False, exact=False)
    result, kept = simplified(build(form), exact=True)
    assert kept.count("Reciprocal") == 2
    same_bits(result)


def test_common_factor_is_hoisted_unless_exact():
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, (3, 4), name="in0")
        y1 = tf.constant(R.standard_normal(4).astype(np.float32))
        y2 = tf.constant(R.standard_normal(4).astype(np.float32))
        tf.identity(x * y1 + y2 * x, name="output")
    built = BuiltModel(graph.as_graph_def(), ["in0"], ["output"])
    result, kept = simplified(built)
    assert kept.count("Mul") == 1 and "AddV2" not in kept, kept    # y1 + y2 folded
    same_bits(result, special=False, exact=False)
    assert_matches(result, 1e-5)
    notes = " ".join(report_of(result, "simplify-algebra").notes)
    assert "reassociated: 1" in notes, notes
    result, kept = simplified(built, exact=True)
    assert kept.count("Mul") == 2
    same_bits(result)


def test_common_factor_refused_when_a_product_is_read_elsewhere():
    def form(x, y):
        first = x * y
        return tf.stack([first + (y + 1.0) * x, first])      # (y*x would merge with x*y)
    result, kept = simplified(build(form))
    assert kept.count("Mul") == 2 and "AddV2" in kept, kept     # x*y is still needed
    assert not any("x*(y1 + y2)" in line for line in report_of(result, "simplify-algebra")
                   .rewritten)
    same_bits(result)


# ---------------------------------------------------------------- random chains of the rules
CHAIN_RULES = {
    "add-neg": lambda x: x + (-(x * 0.5)),
    "sub-neg": lambda x: x - (-(x * 0.25)),
    "recip-recip": lambda x: tf.math.reciprocal(tf.math.reciprocal(x + 3.0)),
    "ones-like": lambda x: x * tf.raw_ops.OnesLike(x=x),
    "zeros-like": lambda x: x + tf.raw_ops.ZerosLike(x=x),
    "split-1": lambda x: tf.raw_ops.Split(axis=1, value=x, num_split=1)[0],
    "double": lambda x: tf.add(tf.nn.relu(x), tf.nn.relu(x)),
    "factor": lambda x: x * 0.5 + 0.25 * x,
    "matmul-t": lambda x: tf.matmul(tf.transpose(x[:, :3]), x),      # [3, 3]·[3, 4]
    "recip-chain": lambda x: tf.math.reciprocal(tf.identity(tf.math.reciprocal(x + 3.0))),
    "push-down": lambda x: (x + 0.75) * 2.0 * 0.5,
    "sum-tree": lambda x: (x + x * 0.5) + x * 0.25,
    "div-factor": lambda x: x / 4.0 + (x * 0.5) / 4.0,
    "commuted": lambda x: tf.add(x, x * 0.5) * tf.add(x * 0.5, x),
}


@settings(max_examples=property_examples(default=20), deadline=None)
@given(st.lists(st.sampled_from(sorted(CHAIN_RULES)), min_size=1, max_size=5),
       st.booleans())
def test_random_chains_of_the_rules_keep_the_numbers(chain, exact):
    def body(x, _):
        for rule in chain:
            x = tf.nn.relu(CHAIN_RULES[rule](x)) - 0.5
        return x
    built = build(body, shape=(3, 4))
    result = optimize(built, bn_fold=False, exact=exact)
    left = ops(result.graph_def)
    assert "OnesLike" not in left and "Split" not in left and "Neg" not in left, (chain, left)
    if not exact:
        assert "Reciprocal" not in left and "ZerosLike" not in left, (chain, left)
    same_bits(result, special=False, exact=exact and "recip-recip" not in chain)
    notes = [note for r in result.reports for note in r.notes if note.startswith("pipeline:")]
    assert notes and notes[-1].endswith("fixpoint reached"), notes
    again = optimize(BuiltModel(result.graph_def, result.inputs, result.outputs), bn_fold=False,
                     exact=exact, verify=False)
    assert again.graph_def.SerializeToString(deterministic=True) == \
        result.graph_def.SerializeToString(deterministic=True), chain     # a true fixpoint


# ---------------------------------------------------------------- merge-duplicates by default
def conv_branch_graph():
    """Two identical conv → batch norm → relu branches on one input (separately stored equal
    weights, as an exporter writes them), summed: Grappler's dedup keeps one branch."""
    w = R.standard_normal((3, 3, 3, 8)).astype(np.float32)
    bn = [R.uniform(0.5, 1.5, 8), R.standard_normal(8), R.standard_normal(8),
          R.uniform(0.5, 1.5, 8)]
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, (1, 8, 8, 3), name="input")
        branches = []
        for _ in range(2):
            z = tf.nn.conv2d(x, tf.constant(w.copy()), 1, "SAME")
            scale, offset, mean, var = (tf.constant(v.astype(np.float32)) for v in bn)
            z = tf.compat.v1.nn.fused_batch_norm(z, scale, offset, mean, var,
                                                 is_training=False)[0]
            branches.append(tf.nn.relu(z))
        tf.identity(branches[0] + branches[1], name="output")
    return BuiltModel(graph.as_graph_def(), ["input"], ["output"])


def test_duplicated_conv_branch_merges_by_default():
    built = conv_branch_graph()
    result = optimize(built)                           # --bn-fold, the default pipeline
    kept = ops(result.graph_def)
    assert kept.count("Conv2D") == 1 and kept.count("Relu") == 1, kept
    assert len(kept) <= 9, kept
    assert_matches(result, 1e-5)
    unmerged = api.optimize(source_of(built), api.choose_transforms(
        [], bn_fold=True, disable=["merge-duplicates", "simplify-algebra"]))
    assert len(unmerged.graph_def.node) > len(kept) + 3


def test_stateful_ops_are_never_merged():
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, (3, 4), name="input")
        one = tf.random.uniform((3, 4), seed=1) + x
        two = tf.random.uniform((3, 4), seed=1) + x
        tf.identity(one - two, name="output")
    built = BuiltModel(graph.as_graph_def(), ["input"], ["output"])
    result = optimize(built, bn_fold=False, verify=False)
    assert ops(result.graph_def).count("RandomUniform") == 2


# ---------------------------------------------------------------- materialize-shapes
def shape_graph(batch):
    """Shape/Rank/Size of an input with a known or an unknown batch, and Keras' batch-keeping
    Reshape(x, concat(shape(x)[:1], [3, 4, 4]))."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, (batch, 3, 4, 4), name="input")
        y = x * tf.constant(R.standard_normal(4).astype(np.float32))
        shape = tf.shape(y)
        same = tf.reshape(y, tf.concat([shape[:1], [3, 4, 4]], 0))
        counts = tf.cast(tf.size(y), tf.float32) + tf.cast(tf.rank(y), tf.float32) + \
            tf.cast(tf.reduce_sum(tf.shape_n([y, y])[1]), tf.float32)
        tf.identity(same * counts, name="output")
    return BuiltModel(graph.as_graph_def(), ["input"], ["output"])


def test_shapes_of_a_fully_known_tensor_become_constants_and_fold():
    result, kept = simplified(shape_graph(2), exact=True)   # (x * c) * counts: no push-down
    assert not {"Shape", "ShapeN", "Size", "Rank", "Reshape", "ConcatV2"} & set(kept), kept
    assert report_of(result, "materialize-shapes").rewritten
    same_bits(result)


def test_an_unknown_batch_keeps_shape_and_size_but_rank_and_the_reshape_go():
    result, kept = simplified(shape_graph(None))
    assert "Rank" not in kept and "Reshape" not in kept, kept
    assert "Size" in kept and ("Shape" in kept or "ShapeN" in kept), kept  # batch unknown
    assert any("not fully known" in why for _, why in
               report_of(result, "materialize-shapes").skipped)
    same_bits(result)


def test_a_reshape_to_another_shape_with_an_unknown_batch_stays():
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, (None, 3, 4, 4), name="input")
        tf.identity(tf.reshape(x, tf.concat([tf.shape(x)[:1], [4, 3, 4]], 0)), name="output")
    result, kept = simplified(BuiltModel(graph.as_graph_def(), ["input"], ["output"]))
    assert "Reshape" in kept
    same_bits(result)


def test_exact_flag_on_the_command_line_keeps_the_common_factor(tmp_path, capsys):
    import json
    from tensorflow.core.framework import graph_pb2
    from tfsurgery.cli import main
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, (3, 4), name="input")
        y = tf.compat.v1.placeholder(tf.float32, (3, 4), name="other")
        tf.identity(x * y + (y + 1.0) * x, name="output")
    path = tmp_path / "g.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    muls = {}
    for flag in ([], ["--exact"]):
        out, report = tmp_path / f"o{len(flag)}.pb", tmp_path / f"r{len(flag)}.json"
        assert main([str(path), "-o", str(out), "--report-json", str(report), *flag]) == 0, \
            capsys.readouterr().err
        result = graph_pb2.GraphDef.FromString(out.read_bytes())
        muls[bool(flag)] = ops(result).count("Mul")
        given = {"input": R.standard_normal((3, 4)).astype(np.float32),
                 "other": R.standard_normal((3, 4)).astype(np.float32)}
        before, after = (oracle.run(g, given, ["output"])[0]
                         for g in (graph.as_graph_def(), result))
        np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)
        algebra = next(t for t in json.loads(report.read_text())["transforms"]
                       if t["name"] == "simplify-algebra")
        assert bool(flag) == any("--exact" in s["reason"] for s in algebra["skipped"])
    assert muls == {False: 1, True: 2}


@pytest.mark.parametrize("form", ["ones_like", "not_not"])
def test_a_bypassed_output_keeps_its_name(form):
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.int32, (3, 4), name="in0")
        if form == "ones_like":
            tf.math.multiply(x, tf.raw_ops.OnesLike(x=x), name="output")
        else:
            tf.math.logical_not(tf.logical_not(x > 2), name="output")
    result, kept = simplified(BuiltModel(graph.as_graph_def(), ["in0"], ["output"]))
    assert "OnesLike" not in kept and "LogicalNot" not in kept, kept
    output = next(n for n in result.graph_def.node if n.name == "output").op
    assert output == ("Identity" if form == "ones_like" else "Greater"), output   # ¬¬: ¬(≤)
    same_bits(result, np.int32)


def test_peer_duplicates_merge_in_a_plain_run():
    """graph_transforms' merge-duplicates tests and Grappler's dedup: two equal Transposes of one
    tensor, Add(a, b) computed twice, three equal constants — one of each is left (no --bn-fold,
    no --enable)."""
    c = R.standard_normal((4, 3)).astype(np.float32)
    with tf.Graph().as_default() as graph:
        a = tf.compat.v1.placeholder(tf.float32, (3, 4), name="in0")
        b = tf.compat.v1.placeholder(tf.float32, (3, 4), name="in1")
        t1, t2 = tf.transpose(a), tf.transpose(a)
        s1, s2 = tf.add(a, b), tf.add(a, b)
        k1, k2, k3 = (tf.constant(c.copy()) for _ in range(3))
        out = tf.concat([t1 * k1, t2 * k2, tf.transpose(s1) * k3, tf.transpose(s2)], 0)
        tf.identity(out, name="output")
    built = BuiltModel(graph.as_graph_def(), ["in0", "in1"], ["output"])
    result, kept = simplified(built)
    assert kept.count("Transpose") == 2 and kept.count("AddV2") == 1, kept
    assert kept.count("Mul") == 2, kept       # t*k twice is one; transpose(s)*k the other
    weights = [n for n in result.graph_def.node if n.op == "Const" and
               n.attr["value"].tensor.tensor_shape.dim and
               [d.size for d in n.attr["value"].tensor.tensor_shape.dim] == [4, 3]]
    assert len(weights) == 1, [n.name for n in weights]
    same_bits(result)


# ---------------------------------------------------------------- AddN and int8 converters
def sum_tree_graph():
    form = lambda x, y: ((x + y) + tf.nn.relu(x)) + tf.sigmoid(y)     # noqa: E731
    return build(form)


def test_sum_trees_can_be_turned_off():
    result, kept = simplified(sum_tree_graph(),
                              transform_params={"simplify-algebra": {"sum_trees": False}})
    assert "AddN" not in kept and kept.count("AddV2") == 3, kept
    same_bits(result)


def test_adds_of_add_n_gives_the_chain_back_for_int8_converters():
    """The TFLite int8 export's step: every AddN a left-to-right chain of AddV2s (TFLite's
    ADD_N has no int8 kernel); the caller's GraphDef untouched, the output name kept."""
    from tfsurgery.transforms.simplify_algebra import adds_of_add_n
    result, kept = simplified(sum_tree_graph())
    assert kept.count("AddN") == 1, kept
    before = result.graph_def.SerializeToString(deterministic=True)
    split = adds_of_add_n(result.graph_def)
    assert result.graph_def.SerializeToString(deterministic=True) == before
    left = ops(split)
    assert "AddN" not in left and left.count("AddV2") == 3, left
    given = feeds(result.test_model, special=False)
    (expected,) = oracle.run(result.graph_def, given, ["output"])
    (actual,) = oracle.run(split, given, ["output"])
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def test_tflite_int8_of_a_sum_tree_is_integer_throughout(tmp_path):
    """Converted as the TFLite int8 export converts (after adds_of_add_n): no float ADD_N
    between DEQUANTIZEs, only the interface quantizes."""
    from tfsurgery.transforms.simplify_algebra import adds_of_add_n
    result, _ = simplified(sum_tree_graph())
    path = tmp_path / "frozen.pb"
    path.write_bytes(adds_of_add_n(result.graph_def).SerializeToString())
    converter = tf.compat.v1.lite.TFLiteConverter.from_frozen_graph(
        str(path), ["in0", "in1"], ["output"], {"in0": [3, 4], "in1": [3, 4]})
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: (
        [R.standard_normal((3, 4)).astype(np.float32) for _ in range(2)] for _ in range(8))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    interpreter = tf.lite.Interpreter(model_content=converter.convert())
    names = [op["op_name"] for op in interpreter._get_ops_details()]
    assert "ADD_N" not in names and names.count("DEQUANTIZE") <= 1, names
