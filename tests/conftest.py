"""Shared fixtures: test graphs are built once per session; helpers to optimize and inspect them."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# benchmarks/ (the development harness) is not installed: the tests import it from the checkout.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from tfsurgery import api  # noqa: E402
from tfsurgery.graph import Graph  # noqa: E402


def source_of(built, label="test graph"):
    return api.Source(built.graph_def, label, inputs=list(built.inputs),
                      outputs=list(built.outputs),
                      training_flags=[built.training_flag] if built.training_flag else [])


def optimize(built, transforms=(), *, bn_fold=True, verify=True, **kwargs):
    """Run tfsurgery on a BuiltModel; verification on by default (a failed check raises
    VerificationFailed). The result remembers the model it came from, for the oracle. Single
    options (``weights="float16"``, ``tolerance=1e-3``) are sorted into api.optimize's groups
    here (api.grouped), so tests stay short."""
    chosen = api.choose_transforms(list(transforms), bn_fold=bn_fold)
    if "checks" not in kwargs:
        kwargs["verify"] = verify
    result = api.optimize(source_of(built), chosen, **api.grouped(**kwargs))
    result.test_model = built
    return result


def assert_matches(result, tolerance=1e-5, **oracle_args):
    """The tests' oracle agrees within ``tolerance`` — and so does the verifier's verdict."""
    worst = assert_same_numbers(result, tolerance=tolerance, **oracle_args)
    assert result.verification is not None and result.verification.passed, \
        result.verification and result.verification.as_dict()
    assert result.verification.max_error <= tolerance, result.verification.as_dict()
    return worst


def assert_same_numbers(result, *, tolerance=1e-5, built=None, original_feeds=None, seed=0,
                        feeds=None):
    """The tests' own oracle (tests/oracle.py, no tfsurgery code): the original model and the
    result run on the same seeded inputs agree within ``tolerance`` of each output's magnitude.
    The original is fed ``original_feeds``, and False for every bool placeholder the result no
    longer has as an input (training switches). Returns the worst relative error."""
    import oracle
    built = built or result.test_model
    given = dict(original_feeds or {})
    for node in built.graph_def.node:
        if node.op == "Placeholder" and node.name not in result.inputs and \
                node.name not in given and node.attr["dtype"].type == 10:   # DT_BOOL
            given[node.name] = False
    return oracle.assert_same_outputs(built.graph_def, result.graph_def, result.inputs,
                                      result.outputs, seed=seed, feeds=feeds,
                                      original_feeds=given, rtol=tolerance)


def ops(graph_def):
    return [n.op for n in graph_def.node]


def report_of(result, name):
    return next(r for r in result.reports if r.name == name)


def consumers_of(graph_def, name):
    graph = Graph(graph_def)
    return [graph.op(c.node) for c in graph.consumers(name)]


@pytest.fixture(scope="session")
def article():
    from tfsurgery.models.tf1 import article_cnn
    return article_cnn(seed=7)


@pytest.fixture(scope="session")
def article_pb(tmp_path_factory, article):
    path = tmp_path_factory.mktemp("article") / "article.pb"
    path.write_bytes(article.graph_def.SerializeToString())
    return path


# ---------------------------------------------------------------- property/fuzz test budget
# `pytest --long` runs the property tests with many more examples (5000 instead of 200);
# TFSURGERY_PROPERTY_EXAMPLES=N overrides the number either way.
_LONG_RUN = {"on": False}


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="run the hypothesis property tests with 5000 examples")


def pytest_configure(config):
    _LONG_RUN["on"] = bool(config.getoption("--long", default=False))


def pytest_terminal_summary(terminalreporter):
    """One line naming the CPU and the oneDNN settings the results belong to (tests/cpu.py)."""
    import cpu
    terminalreporter.write_line(cpu.describe())


def property_examples(default=200, long=5000):
    """How many examples a property test draws: env override, else --long, else the default."""
    value = os.environ.get("TFSURGERY_PROPERTY_EXAMPLES")
    if value:
        return int(value)
    return long if _LONG_RUN["on"] else default
