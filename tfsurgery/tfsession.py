"""Running GraphDefs in TensorFlow: one Session config for the whole tool, and the evaluator the
transforms use for constant parts of a graph. TensorFlow is imported lazily (start-up time)."""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from tfsurgery.cpu_layout import runnable
from tfsurgery.graph import Graph, gc_paused
from tfsurgery.ops import tensor_name
from tfsurgery.trust.outside import refuse


def tf():
    import tensorflow
    return tensorflow


def plain_session_config():
    """A Session config that runs the graph's ops as written: no Grappler rewrites (they would
    blur what is being checked, cost time, and have been seen to abort the process)."""
    config = tf().compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf().compat.v1.OptimizerOptions.L0
    return config


def run_nodes(nodes, fetches: Sequence[str], feeds: Dict[str, np.ndarray] = None,
              library=None) -> List[np.ndarray]:
    """Import ``nodes`` (NodeDefs, in any order) into a fresh graph and fetch ``fetches``."""
    graph_def = tf().compat.v1.GraphDef()
    graph_def.node.extend(nodes)
    if library is not None:
        graph_def.library.CopyFrom(library)
    # never an op acting outside the graph, allowed or not (fold-constants excludes them; this
    # is the backstop)
    refuse(graph_def, fetches, list(feeds or {}), where="a constant subgraph", strict=True)
    graph_def = runnable(graph_def, label="a constant subgraph")
    with tf().Graph().as_default() as graph:
        with gc_paused():               # a Python object per op, all alive: nothing to collect
            tf().compat.v1.import_graph_def(graph_def, name="")
        with tf().compat.v1.Session(graph=graph, config=plain_session_config()) as session:
            return session.run([tensor_name(t) for t in fetches],
                               {tensor_name(k): v for k, v in (feeds or {}).items()})


def tf_errors():
    return tf().errors


STAND_IN_BYTES = 1024     # float Consts larger than this become Placeholders for shape inference


def shape_stand_ins(nodes: Iterable):
    """The nodes, with each large floating-point Const replaced by a Placeholder of its dtype and
    shape: shape inference needs only those (an op's output shape may depend on the *values* of
    small integer tensors — shapes, axes, paddings — never on float weights), and importing a
    graph without its weights is cheap."""
    from tensorflow.core.framework import node_def_pb2
    for node in nodes:
        tensor = node.attr["value"].tensor if node.op == "Const" and "value" in node.attr \
            else None
        if tensor is None or len(tensor.tensor_content) <= STAND_IN_BYTES or \
                not tf().dtypes.as_dtype(tensor.dtype).is_floating:
            yield node
            continue
        stand_in = node_def_pb2.NodeDef(name=node.name, op="Placeholder", device=node.device)
        stand_in.input.extend(text for text in node.input if text.startswith("^"))
        stand_in.attr["dtype"].type = tensor.dtype
        stand_in.attr["shape"].shape.CopyFrom(tensor.tensor_shape)
        yield stand_in


def static_shapes(graph_def) -> Dict[str, Optional[list]]:
    """Node name → the static shape TensorFlow's shape inference gives its first output (a list
    with None for unknown dims; None for unknown rank or no output). Empty if it cannot import."""
    shapes: Dict[str, Optional[list]] = {}
    with tf().Graph().as_default() as graph, gc_paused():
        try:
            tf().compat.v1.import_graph_def(graph_def, name="")
        except (ValueError, TypeError, tf_errors().OpError):    # e.g. an op TF lacks
            return shapes
        for operation in graph.get_operations():
            if operation.outputs:
                shape = operation.outputs[0].shape
                shapes[operation.name] = shape.as_list() if shape.rank is not None else None
    return shapes


class StaticShapes:
    """Static shapes of the first output of every node an output needs (TensorFlow's shape
    inference), computed when a rule first asks about such a node — one import per round at
    most, none when no rule needs a shape. Nodes no output needs (prune removes them) have none."""

    def __init__(self, graph: Graph, outputs):
        self._graph, self._outputs = graph, list(outputs)
        self._live: Optional[set] = None
        self._shapes: Optional[Dict[str, Optional[list]]] = None
        self._complete = False          # every live node imported (else: one node's ancestors)

    def _of(self, name: str) -> Dict[str, Optional[list]]:
        if self._live is None:
            self._live = self._graph.ancestors(self._outputs) if self._outputs \
                else set(self._graph.nodes)
        if name not in self._live:
            return {}
        if self._shapes is None or (name not in self._shapes and not self._complete):
            self._import(name)
        return self._shapes

    def _import(self, name: str) -> None:
        """A node's shape depends on its ancestors only. The first question imports just those
        when they are a small part of the graph (a Pad near the input: ResNet's one question);
        a question they do not answer imports everything live."""
        scope = self._live
        if self._shapes is None:
            ancestors = self._graph.ancestors([name])
            if len(ancestors) * 4 < len(self._live):
                scope = ancestors
        self._complete = scope is self._live
        nodes = (node for node in self._graph if node.name in scope)
        self._shapes = static_shapes(self._graph.to_graph_def(nodes=shape_stand_ins(nodes)))

    def __contains__(self, name: str) -> bool:
        return name in self._of(name)

    def __getitem__(self, name: str) -> Optional[list]:
        return self._of(name)[name]

    def get(self, name: str) -> Optional[list]:
        return self._of(name).get(name)
