"""One index per run: ``api.optimize`` indexes its input once and hands that index down
(interface detection, dropout knobs, preprocessing, class scores, the pipeline, unused inputs),
and the result is byte for byte what a pipeline run on its own fresh index gives."""
import pytest

from conftest import assert_matches, optimize, source_of
from tfsurgery import api, pipeline
from tfsurgery.contract import Options
from tfsurgery.graph import Graph
from tfsurgery.interface import find_dropout_knobs
from tfsurgery.models import recurrent, tf1
from tfsurgery.ops import RANDOM_OPS, node_name


@pytest.fixture
def constructions(monkeypatch):
    """Every Graph built from now on (the class's own __init__, wrapped)."""
    built = []
    original_init = Graph.__init__

    def counting(self, graph_def, *args, **kwargs):
        built.append(len(graph_def.node))
        original_init(self, graph_def, *args, **kwargs)
    monkeypatch.setattr(Graph, "__init__", counting)
    return built


def test_one_optimize_of_the_demo_builds_at_most_two_indexes(constructions, monkeypatch):
    written_back = []           # whole graphs turned back into GraphDefs
    to_graph_def = Graph.to_graph_def

    def counting(self, nodes=None):
        if nodes is None:
            written_back.append(len(self))
        return to_graph_def(self, nodes)
    monkeypatch.setattr(Graph, "to_graph_def", counting)
    source = api.demo()
    result = api.optimize(source, api.choose_transforms(bn_fold=True))
    assert result.verified
    # 2: the run's index of the input (read for the interface, then edited by the pipeline),
    # and the verifier's reference — a copy of the original whose removed dropout is set to its
    # expected value (the original itself must stay as given). Nothing else indexes a graph,
    # and each of the two becomes a GraphDef once (the result; the reference to run).
    assert len(constructions) <= 2, constructions
    assert constructions[0] == len(source.graph_def.node)
    assert len(written_back) <= 2, written_back
    assert written_back[0] == len(result.graph_def.node)


def test_verification_of_several_batches_builds_its_reference_once(constructions):
    api.optimize(api.demo(), api.choose_transforms(bn_fold=True), check_n=3)
    assert len(constructions) <= 2, constructions


def _fresh_pipeline_run(result, flags):
    """The same run the old way: the pipeline on an index of its own, unused inputs removed
    from a second index of its output."""
    inputs = list(result.inputs) + list(result.unused_inputs)
    options = Options(inputs=inputs, outputs=list(result.outputs), training_flags=flags,
                      inference_values=find_dropout_knobs(result.original, exclude=inputs),
                      params=result.params)
    transforms = api.choose_transforms(bn_fold=True)
    graph_def, _ = pipeline.run(result.original, transforms, options)
    if result.unused_inputs:
        graph = Graph(graph_def, check_inputs=False)
        graph.remove([node_name(name) for name in result.unused_inputs])
        graph_def = graph.to_graph_def()
    return graph_def


@pytest.mark.parametrize("build", [tf1.article_cnn, tf1.conv_bn, tf1.cond_dropout,
                                   tf1.nested_cond, tf1.while_loop, tf1.depthwise_bn])
def test_the_shared_index_changes_no_byte(build):
    built = build(seed=3)
    result = optimize(built)
    if not RANDOM_OPS & {n.op for n in built.graph_def.node}:
        assert_matches(result)         # the tests' own oracle, on the original model
    expected = _fresh_pipeline_run(result, [built.training_flag] if built.training_flag else [])
    assert result.graph_def.SerializeToString(deterministic=True) == \
        expected.SerializeToString(deterministic=True)


def test_an_unused_input_is_removed_from_the_shared_index_as_before():
    built = recurrent.tf1_dynamic_rnn("LSTM", seed=2)
    result = api.optimize(api.Source(built.graph_def, "rnn"), api.choose_transforms(bn_fold=True))
    assert list(result.unused_inputs) == ["dropout"]
    assert "dropout" not in {n.name for n in result.graph_def.node}
    expected = _fresh_pipeline_run(result, [])        # flags detected, none given
    assert result.graph_def.SerializeToString(deterministic=True) == \
        expected.SerializeToString(deterministic=True)


def test_a_graph_def_source_is_left_as_given():
    built = tf1.article_cnn(seed=4)
    before = built.graph_def.SerializeToString(deterministic=True)
    result = api.optimize(source_of(built), api.choose_transforms(bn_fold=True))
    assert built.graph_def.SerializeToString(deterministic=True) == before
    assert result.original.SerializeToString(deterministic=True) == before
