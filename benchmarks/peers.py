"""The peers tfsurgery is measured against, each run as its users run it: TensorFlow's
``optimize_for_inference_lib``, offline Grappler (``tf_optimizer``) and tfsurgery itself."""
from __future__ import annotations

from typing import Optional, Sequence

from benchmarks.common import source_of
from tfsurgery import api

VARIANTS = ("original", "optimize_for_inference", "grappler", "tfsurgery")
GRAPPLER_OPTIMIZERS = ("constfold", "arithmetic")
def build_model(name: str, input_size: Optional[int] = None):
    """A BuiltModel by benchmark name."""
    from tfsurgery.models import keras_models, tf1
    if name == "article_cnn":
        return tf1.article_cnn()
    if name == "tf_keras":
        return keras_models.tf_keras_model()
    return keras_models.keras_application(name, input_size=input_size)


def run_optimize_for_inference(built):
    from tensorflow.python.tools import optimize_for_inference_lib
    from tfsurgery.graph import Graph
    graph = Graph(built.graph_def, check_inputs=False)
    dtypes = [graph.node(name).attr["dtype"].type for name in built.inputs]
    return optimize_for_inference_lib.optimize_for_inference(
        built.graph_def, list(built.inputs), list(built.outputs),
        dtypes[0] if len(dtypes) == 1 else dtypes)


def grappler_meta_graph(built):
    """The GraphDef as a MetaGraph whose `train_op` collection names the outputs (Grappler keeps
    fetch nodes, and prunes everything else)."""
    import tensorflow as tf
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(built.graph_def, name="")
        for name in built.outputs:
            graph.add_to_collection("train_op", graph.get_operation_by_name(name))
        return tf.compat.v1.train.export_meta_graph(graph=graph)


def grappler_config(optimizers: Sequence[str] = GRAPPLER_OPTIMIZERS):
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.extend(optimizers)
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    return config


def run_grappler(meta_graph, config):
    from tensorflow.python.grappler import tf_optimizer
    return tf_optimizer.OptimizeGraph(config, meta_graph, verbose=False,
                                      graph_id=b"tfsurgery_benchmark")


def run_tfsurgery(built) -> api.Result:
    source = source_of(built)
    return api.optimize(source, api.choose_transforms(bn_fold=True),
                        checks=api.Checks(verify=False))
