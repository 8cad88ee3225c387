"""api.optimize takes its options in three groups (Interface, Checks, RunOptions); the flat
keywords of earlier releases still work for one release, with a DeprecationWarning, and a keyword
that its group also sets is an error, never a silent override."""
import inspect
import warnings

import pytest

from tfsurgery import api
from tfsurgery.cli import main
from conftest import assert_same_numbers, ops, source_of


def test_optimize_takes_at_most_six_parameters():
    assert len(inspect.signature(api.optimize).parameters) <= 6


def test_a_flat_keyword_warns_and_means_what_its_group_means(article):
    with pytest.warns(DeprecationWarning, match="weights=.*RunOptions"):
        flat = api.optimize(source_of(article), ["prune", "float16-weights"], verify=False,
                            weights="float16")
    grouped = api.optimize(source_of(article), ["prune", "float16-weights"],
                           checks=api.Checks(verify=False),
                           options=api.RunOptions(weights="float16"))
    assert flat.graph_def.SerializeToString() == grouped.graph_def.SerializeToString()
    assert flat.weights == grouped.weights == "float16" and flat.verify_skipped
    assert flat.tolerance == grouped.tolerance == api.FLOAT16_TOLERANCE
    assert "Cast" in ops(grouped.graph_def)         # the weights really are float16 now
    grouped.test_model = article
    assert_same_numbers(grouped, tolerance=api.FLOAT16_TOLERANCE)      # the tests' own oracle


@pytest.mark.parametrize("groups, keyword, option", [
    ({"checks": api.Checks()}, {"verify": False}, "checks.verify"),
    ({"checks": api.Checks(tolerance=1e-3)}, {"tolerance": 1e-2}, "checks.tolerance"),
    ({"checks": api.Checks()}, {"verify_timeout": 5.0}, "checks.timeout"),
    ({"options": api.RunOptions(weights="float16")}, {"weights": "int8"}, "options.weights"),
    ({"interface": api.Interface(outputs=["logits"])}, {"outputs": ["x"]}, "interface.outputs"),
])
def test_a_keyword_and_its_group_together_are_an_input_error(article, groups, keyword, option):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(api.InputError, match=option.replace(".", r"\.")):
            api.optimize(source_of(article), ["prune"], **groups, **keyword)


def test_an_unknown_keyword_is_a_type_error(article):
    with pytest.raises(TypeError, match="no_such_option"):
        api.optimize(source_of(article), ["prune"], no_such_option=1)


def test_grouped_sorts_flat_keywords_into_their_groups():
    groups = api.grouped(inputs=["x"], seed=3, verify_timeout=9.0, layout="NHWC")
    assert groups["interface"] == api.Interface(inputs=["x"])
    assert groups["checks"] == api.Checks(seed=3, timeout=9.0)
    assert groups["options"] == api.RunOptions(layout="NHWC")


def test_the_cli_uses_the_groups(article_pb, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["inspect", str(article_pb), "--store-weights", "float16", "-q"]) == 0
    assert [w for w in caught if "flat keywords" in str(w.message)] == []
