"""Property-based tests: random TF1-style frozen graphs (tests/strategies.py) through the whole
pipeline with --bn-fold.

For every generated graph:
  1. the optimized graph computes what the original computes (training flag False) within 1e-4,
     relative to each output's magnitude — tfsurgery's own verification result (for the rare deep,
     ill-conditioned graph: within 4x the float32 noise floor verify measures) — and the caller's
     GraphDef is not mutated;
  2. every batch norm that was safe to fold (right after a constant-weight conv / depthwise /
     matmul, possibly behind its bias, whose output nothing else reads) is gone: the linear op is
     read by exactly one BiasAdd, and the only batch norms left are ones that were unsafe to fold;
     no training flag, Switch or Merge is left;
  3. the pipeline is a fixed point: optimizing the result again changes no byte.

The run is reproducible: derandomized, no example database. 200 examples by default (12-15 s on
2 cores); `pytest --long` draws 5000 (6 min here);
TFSURGERY_PROPERTY_EXAMPLES=N overrides both.
"""
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings

from conftest import optimize, property_examples
from tfsurgery.models.common import BuiltModel
from strategies import BN_OPS, build, graph_specs
from tfsurgery import verify
from tfsurgery.graph import Graph

TOLERANCE = 1e-4


def _settings(examples, **kwargs):
    return settings(max_examples=examples, database=None, derandomize=True, deadline=None,
                    print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    **kwargs)


def serialized(graph_def) -> bytes:
    return graph_def.SerializeToString(deterministic=True)


def _skips(result):
    return [s for r in result.reports for s in r.skipped]


def check_optimized(built):
    model = built.model
    before = serialized(model.graph_def)
    result = optimize(model)

    # 1. same numbers, input untouched. The bar is 1e-4 relative; a graph whose own outputs move by
    # more than that for a 1-ulp change of its input (verify's noise floor) gets NOISE_FACTOR x
    # its floor instead, as tfsurgery itself allows. Graphs too ill-conditioned for any float32
    # comparison to mean something (floor > 1e-3) are discarded.
    check = result.verification
    assert result.verification_error is None, result.verification_error
    assume(check.noise_floor <= 1e-3)
    assert check.passed, check.as_dict()
    assert check.max_error <= max(TOLERANCE, verify.NOISE_FACTOR * check.noise_floor), \
        check.as_dict()
    assert serialized(model.graph_def) == before, "the input GraphDef was mutated"

    # 2. lean: every safe batch norm folded, only unsafe ones left, no control flow left
    out = Graph(result.graph_def)
    for linear in built.fold_linear:
        readers = [c.node for c in out.consumers(linear, control=True)]
        # a scale-only chain folds to a zero bias, which simplify-arithmetic removes; an output
        # then keeps its name as an Identity of the linear op
        zero_bias_output = [out.op(r) for r in readers] == ["Identity"] and \
            readers[0] in result.outputs
        assert [out.op(r) for r in readers] == ["BiasAdd"] or zero_bias_output, \
            (linear, readers, _skips(result))
    for bn in built.fold_bn:
        assert bn not in out or out.op(bn) not in BN_OPS, (bn, _skips(result))
    left = {n.name for n in result.graph_def.node if n.op in BN_OPS}
    assert left <= set(built.may_keep_bn), (left - set(built.may_keep_bn), _skips(result))
    ops = {n.op for n in result.graph_def.node}
    assert not ops & {"Switch", "Merge", "RandomUniform"}, ops
    assert "training" not in out, "the training flag survived"

    # 3. a fixed point
    again = BuiltModel(result.graph_def, result.inputs, result.outputs, None)
    second = optimize(again, verify=False)
    assert serialized(second.graph_def) == serialized(result.graph_def), \
        [r.as_dict() for r in second.reports if r.rewritten or r.removed_nodes]
    return result


@_settings(property_examples())
@given(graph_specs())
def test_optimized_graph_is_exact_lean_and_a_fixed_point(spec):
    check_optimized(build(spec))


@_settings(max(20, property_examples() // 10), phases=[Phase.generate])   # known: no shrinking
@given(graph_specs(negated=True))
def _negated_conds_collapse(spec):
    check_optimized(build(spec))


def test_conds_on_a_negated_training_flag_collapse_too():
    _negated_conds_collapse()


def test_nchw_conv_then_two_muls_does_not_abort_verification(tmp_path):
    """In a subprocess: the failure kills the interpreter (SIGABRT)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    import numpy as np
    import tensorflow as tf
    from tfsurgery.models import tf1
    with tf1.v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 4, 5, 5], name="input")
        y = tf.nn.conv2d(x, tf.constant(np.ones([3, 3, 4, 4], np.float32)), 1, "SAME",
                         data_format="NCHW")
        y = y * tf.constant(np.full([4, 1, 1], 0.5, np.float32))
        y = y * tf.constant(np.full([4, 1, 1], 2.0, np.float32))
        tf.identity(y, name="output")
    (tmp_path / "nchw_mul_mul.pb").write_bytes(graph.as_graph_def().SerializeToString())
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, str(root / "scripts" / "optimize.py"),
                           str(tmp_path / "nchw_mul_mul.pb"), "--bn-fold", "-q"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
