"""Mutation tests aimed at the verifier itself: wrong results it must catch (one weight moved,
two outputs swapped, NaN in a new place), and a verifier bug — the result compared with itself —
that the tests' own oracle catches where the verifier cannot. Each mutation is confirmed real by
the oracle before the verifier is judged."""
import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api, pipeline
from tfsurgery.verify import check as verify
from tfsurgery.cli import main
from tfsurgery.errors import CannotVerify, Unverified, VerificationFailed
from tfsurgery.graph import Graph
from tfsurgery.contract import TransformReport, transform

import oracle

TOLERANCE = 1e-4


def two_heads(seed: int = 0):
    """input [N, 8] → dense → relu → two dense heads 'out_a', 'out_b' (same shape), and a
    'root' = sqrt of the first head (NaN where it is negative)."""
    r = np.random.default_rng(seed)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="input")
        h = tf.nn.relu(tf.matmul(tf.identity(x), tf.constant(r.standard_normal((8, 8)),
                                                              tf.float32, name="w1")))
        a = tf.matmul(h, tf.constant(r.standard_normal((8, 4)), tf.float32, name="wa"))
        b = tf.matmul(h, tf.constant(r.standard_normal((8, 4)), tf.float32, name="wb"))
        tf.identity(a, name="out_a")
        tf.identity(b, name="out_b")
        tf.math.sqrt(a, name="root")
    return graph.as_graph_def()


@transform("nudge-one-weight")
def _nudge_one_weight(graph: Graph, options) -> TransformReport:
    """wa[0, 0] moved by 1e-3 of the largest weight: a fold that is almost right."""
    value = graph.const_value("wa").copy()
    value[0, 0] += 1e-3 * np.abs(value).max()
    graph.set_const_value("wa", value)
    return TransformReport("nudge-one-weight", rewritten=["wa"])


@transform("swap-outputs")
def _swap_outputs(graph: Graph, options) -> TransformReport:
    a, b = graph.inputs("out_a")[0], graph.inputs("out_b")[0]
    graph.set_input("out_a", 0, str(b))
    graph.set_input("out_b", 0, str(a))
    return TransformReport("swap-outputs", rewritten=["out_a", "out_b"])


@transform("move-the-nan")
def _move_the_nan(graph: Graph, options) -> TransformReport:
    """root = sqrt(a) + 0·log(a − 50): the same finite values, NaN also where 0 ≤ a < 50."""
    a = graph.inputs("root")[0]
    half = graph.add_const("half", np.float32(50.0))
    zero = graph.add_const("zero", np.float32(0.0))
    shifted = graph.new_node("Sub", "shifted", [a, half], {"T": tf.float32})
    log = graph.new_node("Log", "log", [shifted.name], {"T": tf.float32})
    nothing = graph.new_node("Mul", "nothing", [log.name, zero], {"T": tf.float32})
    sqrt = graph.new_node("Sqrt", "sqrt_of_a", [a], {"T": tf.float32})
    graph.remove(["root"])
    graph.new_node("AddV2", "root", [sqrt.name, nothing.name], {"T": tf.float32})
    return TransformReport("move-the-nan", rewritten=["root"])


def run_mutation(monkeypatch, name, fn, outputs):
    monkeypatch.setitem(pipeline.REGISTRY, name, fn)
    original = two_heads()
    source = api.Source(original, "heads", inputs=["input"], outputs=outputs)
    with pytest.raises(VerificationFailed) as failed:
        api.optimize(source, [name])
    return original, failed.value


def test_one_weight_moved_by_1e_3_is_caught(monkeypatch):
    original, failed = run_mutation(monkeypatch, "nudge-one-weight", _nudge_one_weight,
                                    ["out_a", "out_b"])
    feeds = oracle.random_feeds(original, ["input"], seed=0)
    before = oracle.run(original, feeds, ["out_a"])[0]
    after = oracle.run(failed.result.graph_def, feeds, ["out_a"])[0]
    assert oracle.relative_error(before, after) > TOLERANCE        # the mutation is real
    errors = {o.name: o.max_rel for o in failed.verification.outputs}
    assert errors["out_a"] > TOLERANCE and errors["out_b"] == 0     # named where it moved


def test_two_outputs_swapped_are_caught(monkeypatch):
    original, failed = run_mutation(monkeypatch, "swap-outputs", _swap_outputs,
                                    ["out_a", "out_b"])
    feeds = oracle.random_feeds(original, ["input"], seed=0)
    a, b = oracle.run(failed.result.graph_def, feeds, ["out_a", "out_b"])
    expected_a, expected_b = oracle.run(original, feeds, ["out_a", "out_b"])
    np.testing.assert_array_equal(a, expected_b)                   # really swapped
    errors = {o.name: o.max_rel for o in failed.verification.outputs}
    assert errors["out_a"] > 0.1 and errors["out_b"] > 0.1


def test_nan_in_a_different_place_is_caught(monkeypatch):
    original, failed = run_mutation(monkeypatch, "move-the-nan", _move_the_nan, ["root"])
    feeds = oracle.random_feeds(original, ["input"], seed=0)
    before = oracle.run(original, feeds, ["root"])[0]
    after = oracle.run(failed.result.graph_def, feeds, ["root"])[0]
    both = np.isfinite(before) & np.isfinite(after)
    np.testing.assert_allclose(before[both], after[both], rtol=1e-6)   # same finite values...
    assert not np.array_equal(np.isnan(before), np.isnan(after))     # ...NaN moved
    assert failed.max_error == float("inf")


def test_a_verifier_comparing_the_result_with_itself_is_caught_by_the_oracle(monkeypatch):
    """The bug class a verifier-only suite cannot see: with the reference taken from the result,
    a wrong fold passes the verifier — and fails the oracle. And the real API never does it: the
    original it verifies against is the user's graph, not the result."""
    monkeypatch.setitem(pipeline.REGISTRY, "nudge-one-weight", _nudge_one_weight)
    original = two_heads()
    source = api.Source(original, "heads", inputs=["input"], outputs=["out_a"])
    seen = []
    real_verify = verify.verify

    def recording(reference, optimized, *args, **kwargs):
        seen.append(reference.SerializeToString(deterministic=True))
        return real_verify(reference, optimized, *args, **kwargs)
    monkeypatch.setattr(verify, "verify", recording)
    with pytest.raises(VerificationFailed) as failed:
        api.optimize(source, ["nudge-one-weight"])
    assert seen == [original.SerializeToString(deterministic=True)]
    # The mutated verifier: the result as its own reference passes...
    result = failed.value.result
    itself = real_verify(result.graph_def, result.graph_def, ["input"], ["out_a"])
    assert itself.passed and itself.max_error == 0
    # ...and the oracle, comparing with the user's original, does not.
    with pytest.raises(AssertionError, match="relative error"):
        oracle.assert_same_outputs(original, result.graph_def, ["input"], ["out_a"],
                                   rtol=TOLERANCE)


# ---------------------------------------------------------------- a check that cannot see
def saturated_relu6(seed: int = 4):
    """input [N, 8, 8, 3] → conv (random kernel) → BiasAdd (+100: ReLU6 is at 6 for any input
    scale) → Relu6 → mean → 'output'. The output is 6 whatever the conv's weights are: only the
    conv and its bias's tensors can show a change of them."""
    r = np.random.default_rng(seed)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3], name="input")
        kernel = tf.constant(r.standard_normal((3, 3, 3, 4)).astype(np.float32), name="kernel")
        conv = tf.nn.conv2d(x, kernel, 1, "SAME", name="conv")
        bias = tf.constant((100 + r.standard_normal(4)).astype(np.float32), name="bias")
        tf.reduce_mean(tf.nn.relu6(tf.nn.bias_add(conv, bias, name="bias_add")), axis=[1, 2],
                       name="output")
    return graph.as_graph_def()


def renamed(name: str, *, declare: bool, factor: float = 1.0):
    """A user's transform in the style of a fusion: the conv and its BiasAdd rebuilt under new
    names (the kernel × ``factor``); with ``declare`` it says which new tensor stands for which
    old one (``report.corresponds``), as a transform that renames must."""
    @transform(name)
    def rename(graph: Graph, options) -> TransformReport:
        report = TransformReport(name)
        x, kernel = graph.inputs("conv")
        scaled = graph.add_const("fused/kernel", graph.const_value(kernel) * factor)
        attrs = dict(graph.node("conv").attr)
        conv = graph.new_node("Conv2D", "fused/conv", [x, scaled], attrs)
        bias = graph.new_node("BiasAdd", "fused/bias_add",
                              [conv.name, graph.inputs("bias_add")[1]], {"T": tf.float32})
        graph.rewire("bias_add", bias.name)
        graph.remove(["bias_add", "conv"])
        if declare:
            report.corresponds("fused/conv", "conv")
            report.corresponds("fused/bias_add", "bias_add")
        report.rewritten.append("conv + bias_add -> fused/conv + fused/bias_add")
        return report
    return rename


def optimize_renamed(monkeypatch, fn, **checks):
    monkeypatch.setitem(pipeline.REGISTRY, fn.transform_name, fn)
    source = api.Source(saturated_relu6(), "relu6", inputs=["input"], outputs=["output"])
    return api.optimize(source, [fn.transform_name], checks=api.Checks(**checks))


def test_renamed_tensors_and_saturated_outputs_cannot_verify(monkeypatch, tmp_path, capsys):
    """Nothing compared can show the conv's weights: the outputs are saturated at every input
    scale, and the renamed tensors have no counterpart — "cannot verify", not a pass."""
    with pytest.raises(CannotVerify) as blind:
        optimize_renamed(monkeypatch, renamed("rename-undeclared", declare=False))
    assert isinstance(blind.value, VerificationFailed) and isinstance(blind.value, Unverified)
    check = blind.value.verification
    assert check.blind == ["conv"] and not check.passed and check.max_error == 0
    assert str(blind.value).startswith("cannot verify") and "--samples" in str(blind.value)
    assert blind.value.result.divergence is None                   # nothing to localize
    # the oracle: the output really cannot see the conv (its kernel ×1.05 changes nothing)
    original = saturated_relu6()
    mutated = optimize_renamed(monkeypatch, renamed("rename-scaled", declare=False,
                                                    factor=1.05),
                               accept_blind_spots=True).graph_def
    feeds = oracle.random_feeds(original, ["input"], seed=0)
    assert oracle.relative_error(oracle.run(original, feeds, ["output"])[0],
                                 oracle.run(mutated, feeds, ["output"])[0]) == 0
    assert oracle.relative_error(oracle.run(original, feeds, ["bias_add"])[0],
                                 oracle.run(mutated, feeds, ["fused/bias_add"])[0]) > TOLERANCE


def test_accepting_the_blind_spot_passes_and_says_so(monkeypatch):
    result = optimize_renamed(monkeypatch, renamed("rename-accepted", declare=False),
                              accept_blind_spots=True)
    check = result.verification
    assert check.passed and check.blind == ["conv"] and check.blind_accepted
    assert check.as_dict()["cannot_verify"] is False and check.as_dict()["blind"] == ["conv"]


def test_declared_correspondence_is_compared_and_sees_the_conv(monkeypatch):
    result = optimize_renamed(monkeypatch, renamed("rename-declared", declare=True))
    check = result.verification
    assert check.passed and not check.blind, check.failure()
    assert {"fused/conv:0", "fused/bias_add:0"} <= {e.name for e in check.intermediate}
    assert result.reports.correspondence == {"fused/conv:0": "conv:0",
                                             "fused/bias_add:0": "bias_add:0"}
    oracle.assert_same_outputs(saturated_relu6(), result.graph_def, ["input"], ["bias_add"],
                               result_outputs=["fused/bias_add"], rtol=1e-5)


def test_a_kernel_times_1_05_behind_a_declared_correspondence_is_caught(monkeypatch):
    with pytest.raises(VerificationFailed) as failed:
        optimize_renamed(monkeypatch, renamed("rename-declared-scaled", declare=True,
                                              factor=1.05))
    assert not isinstance(failed.value, CannotVerify)
    hidden = {e.name for e in failed.value.verification.hidden}
    assert "fused/conv:0" in hidden and "intermediate tensor" in str(failed.value)
    original, mutated = saturated_relu6(), failed.value.result.graph_def
    feeds = oracle.random_feeds(original, ["input"], seed=0)
    assert oracle.relative_error(oracle.run(original, feeds, ["conv"])[0],
                                 oracle.run(mutated, feeds, ["fused/conv"])[0]) > 1e-2


def test_the_cli_says_cannot_verify_with_exit_1_and_accepts_when_told(tmp_path, capsys):
    model, plugin, out = tmp_path / "relu6.pb", tmp_path / "rename.py", tmp_path / "out.pb"
    model.write_bytes(saturated_relu6().SerializeToString())
    plugin.write_text(RENAME_PLUGIN)
    args = [str(model), "--plugin", str(plugin), "--transforms", "rename-conv", "-o", str(out)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "cannot verify" in err and "--accept-blind-spots" in err and not out.exists()
    assert main(args + ["--accept-blind-spots"]) == 0 and out.exists()


RENAME_PLUGIN = '''
import tfsurgery

@tfsurgery.transform("rename-conv")
def rename_conv(graph, options):
    """The conv and its BiasAdd under new names, nothing declared."""
    report = tfsurgery.TransformReport("rename-conv")
    conv = graph.new_node("Conv2D", "renamed/conv", graph.inputs("conv"),
                          dict(graph.node("conv").attr))
    bias = graph.new_node("BiasAdd", "renamed/bias_add",
                          [conv.name, graph.inputs("bias_add")[1]],
                          dict(graph.node("bias_add").attr))
    graph.rewire("bias_add", bias.name)
    graph.remove(["bias_add", "conv"])
    report.rewritten.append("conv, bias_add -> renamed/conv, renamed/bias_add")
    return report
'''


def test_the_probed_sample_spreads_over_the_whole_depth():
    """Whatever part of the sample the time budget allows covers the graph from its first layer
    to its last: the first, the last, then the middles of the gaps left."""
    from tfsurgery.verify import sensitivity
    layers = list(range(53))
    sample = sensitivity.sample_layers(layers)
    assert sample[:5] == [0, 52, 26, 13, 39] and len(sample) == sensitivity.PROBE_MAX_LAYERS
    assert len(set(sample)) == len(sample)
    assert sensitivity.sample_layers(list(range(5))) == [0, 4, 2, 1, 3]      # all of a few
