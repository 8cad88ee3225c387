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
    """Run tfsurgery on a BuiltModel; verification on by default."""
    chosen = api.choose_transforms(list(transforms), bn_fold=bn_fold)
    return api.optimize(source_of(built), chosen, verify=verify, **kwargs)


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


def property_examples(default=200, long=5000):
    """How many examples a property test draws: env override, else --long, else the default."""
    value = os.environ.get("TFSURGERY_PROPERTY_EXAMPLES")
    if value:
        return int(value)
    return long if _LONG_RUN["on"] else default
