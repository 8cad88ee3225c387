"""A graph's interface: its inputs (placeholders to feed), outputs, and training flags.

A training flag is a bool ``Placeholder``/``PlaceholderWithDefault`` with a scalar shape whose name
(last path component) is one of the usual training-switch names, or a name the user passes with
``--training-flag``.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from tensorflow.core.framework import tensor_shape_pb2, types_pb2

from tfsurgery.errors import InputError
from tfsurgery.graph import Graph, num_outputs, parse_ref
from tfsurgery.ops import (FEEDABLE_PLACEHOLDER_OPS, NOT_OUTPUT_OPS, PLACEHOLDER_OPS,
                           RANDOM_OPS, node_name)

COMMON_FLAG_NAMES = frozenset({
    "training", "is_training", "istraining", "train", "is_train", "phase_train", "phase",
    "train_phase", "training_phase", "keras_learning_phase", "learning_phase", "training_flag",
    "bn_training", "mode_training",
})
_FLAG_OPS = PLACEHOLDER_OPS


def is_training_flag(node, extra_names=()) -> bool:
    """Is this NodeDef a bool scalar placeholder that switches training on and off?"""
    if node.op not in _FLAG_OPS:
        return False
    dtype = node.attr["dtype"].type if "dtype" in node.attr else node.attr["T"].type
    if dtype != types_pb2.DT_BOOL:
        return False
    if node.name in extra_names:
        return True
    shape = node.attr["shape"].shape if "shape" in node.attr else None
    if shape is not None and not shape.unknown_rank and len(shape.dim) > 0:
        return False
    return node.name.rsplit("/", 1)[-1].lower() in COMMON_FLAG_NAMES


def find_training_flags(graph_def, extra_names=()):
    return [n.name for n in graph_def.node if is_training_flag(n, extra_names)]


# TF2's freezing leaves placeholders for a function's captured control-flow inputs
# (bool/variant, unknown rank) that nothing needs: not inputs.
FREEZING_LEFTOVER = "unused_control_flow_input"


def detect_inputs(graph_def, training_flags: Sequence[str] = ()) -> List[str]:
    """Placeholders that must be fed and are not training flags (a PlaceholderWithDefault has a
    value of its own and is not counted)."""
    return [n.name for n in graph_def.node
            if n.op in FEEDABLE_PLACEHOLDER_OPS and not is_training_flag(n, training_flags)
            and not n.name.startswith(FREEZING_LEFTOVER)]


def detect_outputs(graph_def) -> List[str]:
    """Nodes nothing consumes (excluding Const, NoOp and other leftovers that compute nothing)."""
    consumed = {parse_ref(text).node for node in graph_def.node for text in node.input}
    return [n.name for n in graph_def.node
            if n.name not in consumed and n.op not in NOT_OUTPUT_OPS]


def indexed(graph) -> Graph:
    """The run's index when the caller hands one down, else an index of the GraphDef given."""
    return graph if isinstance(graph, Graph) else Graph(graph, check_inputs=False)


def unused_inputs(graph, inputs: Sequence[str], outputs: Sequence[str]) -> List[str]:
    """Inputs no output reads (after optimization: a ``dropout`` rate that only fed the
    training side of a cond): no value of theirs can change the outputs any more. ``graph``:
    a Graph (the run's index) or a GraphDef."""
    needed = indexed(graph).ancestors(outputs)
    return [name for name in inputs if node_name(name) not in needed]


def resolve_interface(graph_def, inputs: Sequence[str] = (), outputs: Sequence[str] = (),
                      training_flags: Sequence[str] = ()) -> Tuple[List[str], List[str]]:
    """Check user-given input/output names against the graph, or detect them."""
    graph = {node.name: node for node in graph_def.node}      # a light index: names only
    for kind, given in (("input", inputs), ("output", outputs)):
        missing = [g for g in given if parse_ref(g).node not in graph]
        if missing:
            raise InputError(f"unknown {kind} name {', '.join(map(repr, missing))}: "
                             "no such node in the graph")
        for name in given:
            ref = parse_ref(name)
            ports = num_outputs(graph[ref.node])
            if ports is not None and ref.port >= ports:
                raise InputError(f"{kind} '{name}': {graph[ref.node].op} node '{ref.node}' has "
                                 f"{ports} output(s)")
    for name in inputs:
        op = graph[parse_ref(name).node].op
        if op not in PLACEHOLDER_OPS:
            raise InputError(f"input '{name}' is a {op} node, not a Placeholder to feed")
    inputs = list(inputs) or detect_inputs(graph_def, training_flags)
    outputs = list(outputs) or detect_outputs(graph_def)
    if not outputs:
        raise InputError("could not find the graph's outputs; name them with --outputs")
    return inputs, outputs


# ---------------------------------------------------------------- inference knobs
KEEP, RATE = 1.0, 0.0          # a dropout knob's inference value: keep everything / drop nothing


def find_dropout_knobs(graph, exclude: Sequence[str] = ()) -> Dict[str, float]:
    """Float scalar placeholders that only steer dropout, with their inference value (``graph``:
    a Graph — the run's index — or a GraphDef).

    TF1 ``tf.nn.dropout(x, keep_prob)`` reads ``keep_prob`` in ``Add(keep_prob, random)`` (the
    mask) and ``RealDiv(x, keep_prob)`` (the scale): a keep probability, 1.0 at inference. TF2
    ``tf.nn.dropout(x, rate)`` reads ``rate`` in ``GreaterEqual(random, rate)`` and
    ``Sub(1, rate)``: a rate, 0.0 at inference. A placeholder read anywhere else is no knob.
    """
    graph = indexed(graph)
    near_random = _near(graph, [n.name for n in graph if n.op in RANDOM_OPS], hops=3)
    knobs = {}
    for node in graph:
        if node.op in PLACEHOLDER_OPS and node.name not in exclude and _float_scalar(node):
            kind = _knob_kind(graph, node.name, near_random)
            if kind in ("keep", "rate"):
                knobs[node.name] = KEEP if kind == "keep" else RATE
    return knobs


def _knob_kind(graph: Graph, name: str, near_random: set, depth: int = 0) -> Optional[str]:
    """"keep" or "rate" if every reader of ``name`` uses it as a dropout keep probability or
    rate (a mask comparison against a random tensor, or the 1/keep scale); else None.
    ``1 - name`` is followed (twice at most): TF2's dropout turns a keep_prob into a rate, and
    a rate into the 1/(1 - rate) scale, that way."""
    kinds = set()
    for consumer in graph.consumers(name):
        node = graph.node(consumer.node)
        others = [ref for ref in graph.inputs(node.name) if ref.node != name]
        random_other = bool(others) and others[0].node in near_random
        if node.op in ("Add", "AddV2") and random_other:
            kinds.add("keep")                        # floor(keep + u)
        elif node.op in ("GreaterEqual", "Less") and random_other and consumer.index == 1:
            kinds.add("rate")                        # u >= rate
        elif node.op in ("RealDiv", "Div") and consumer.index == 1:
            kinds.add("scale")                       # x / keep
        elif node.op == "Sub" and consumer.index == 1 and depth < 2 and others and \
                graph.is_const(others[0]):
            inner = _knob_kind(graph, node.name, near_random, depth + 1)   # 1 - name
            kinds.add({"keep": "rate", "rate": "keep", "scale": "scale"}.get(inner, "other"))
        else:
            kinds.add("other")
    if kinds == {"scale"}:
        return "scale"
    kinds.discard("scale")
    return kinds.pop() if len(kinds) == 1 else None


def _near(graph: Graph, starts: Sequence[str], hops: int) -> set:
    """Nodes at most ``hops`` data edges downstream of ``starts`` (the starts included)."""
    reached, frontier = set(starts), list(starts)
    for _ in range(hops):
        frontier = [c.node for name in frontier for c in graph.consumers(name)
                    if c.node not in reached]
        reached.update(frontier)
    return reached


def _float_scalar(node) -> bool:
    dtype = node.attr["dtype"].type if "dtype" in node.attr else None
    if dtype not in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_HALF,
                     types_pb2.DT_BFLOAT16):
        return False
    shape = node.attr["shape"].shape if "shape" in node.attr else None
    return shape is None or shape.unknown_rank or len(shape.dim) == 0


# ---------------------------------------------------------------- declared inputs
QUEUE_OPS = frozenset({"QueueDequeueV2", "QueueDequeueManyV2", "QueueDequeueUpToV2",
                       "QueueDequeue", "QueueDequeueMany", "QueueDequeueUpTo", "IteratorGetNext",
                       "IteratorGetNextSync", "ReaderReadV2", "ReaderRead"})


def needs_declaring(graph_def, inputs: Sequence[str]) -> bool:
    """Does any named input still have to become a plain Placeholder (it is a
    ``PlaceholderWithDefault`` or some other op's tensor)?"""
    named = {node_name(name) for name in inputs}
    return any(node.name in named and node.op not in FEEDABLE_PLACEHOLDER_OPS
               for node in graph_def.node)


def with_declared_inputs(graph_def, inputs: Sequence[str],
                         shapes: Mapping[str, Sequence[Optional[int]]],
                         notes: Optional[List[str]] = None):
    """A copy of the graph with the user's interface applied: a named tensor that is not a
    placeholder (a dequeue, an iterator output) is cut from its source and becomes a Placeholder
    of its dtype and shape (as ``strip_unused`` does); so does a named ``PlaceholderWithDefault``
    (what the user feeds; tf2onnx refuses one whose default is a tensor), and what only fed its
    default goes with it; ``shapes`` are set on the placeholders. Each cut is said in ``notes``."""
    graph = Graph(graph_def, check_inputs=False)
    unknown = [n for n in shapes if node_name(n) not in graph]
    if unknown:
        raise InputError(f"--input-shape names '{unknown[0]}', which is no node in the graph")
    named = {node_name(name) for name in inputs}
    for name in inputs:
        if graph.op(node_name(name)) not in FEEDABLE_PLACEHOLDER_OPS:
            note = _cut_to_placeholder(graph, name, shapes.get(name, shapes.get(node_name(name))),
                                       keep=named)
            if notes is not None:
                notes.append(note)
    for name, dims in shapes.items():
        node = graph.node(node_name(name))
        if node.op not in PLACEHOLDER_OPS:
            raise InputError(f"--input-shape: '{name}' is a {node.op} node, not an input; "
                             "name it with --inputs too")
        _set_shape(graph.edit_node(node.name), dims)
    return graph.to_graph_def()


def _cut_to_placeholder(graph: Graph, name: str, dims, keep=()) -> str:
    """Make the tensor ``name`` a Placeholder; returns what was done, for the report."""
    ref = parse_ref(name)
    node = graph.node(ref.node)
    readers = {c.ref.port for c in graph.consumers(ref.node)}
    if readers - {ref.port}:
        raise InputError(f"input '{name}': other outputs of {node.op} '{ref.node}' are read too; "
                         "only a single-output tensor can become an input")
    was = node.op
    dtype, shape = _default_signature(graph, node) if was == "PlaceholderWithDefault" \
        else _output_signature(graph, node, ref.port)
    sources = [parse_ref(text).node for text in node.input]
    graph.remove([ref.node])
    removed = _remove_orphans(graph, sources, keep)
    placeholder = graph.new_node("Placeholder", ref.node)
    placeholder.attr["dtype"].type = dtype
    if shape is not None:
        placeholder.attr["shape"].shape.CopyFrom(shape)
    if dims is not None:
        _set_shape(placeholder, dims)
    if ref.port:
        graph.rewire(ref, parse_ref(ref.node))
    what = "its default" if was == "PlaceholderWithDefault" else "it"
    gone = f"; {len(removed)} node(s) that only fed {what} removed ({_listed(removed)})" \
        if removed else ""
    return (f"input '{name}' (a {was}) is now a Placeholder{_signature_text(placeholder)}"
            f"{gone}")


def _signature_text(placeholder) -> str:
    import tensorflow as tf
    dtype = tf.dtypes.as_dtype(placeholder.attr["dtype"].type).name
    shape = placeholder.attr["shape"].shape if "shape" in placeholder.attr else None
    if shape is None or shape.unknown_rank:
        return f" ({dtype}, any shape)"
    return f" ({dtype} [{', '.join('?' if d.size < 0 else str(d.size) for d in shape.dim)}])"


def _listed(names: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f", ... {len(names) - most} more" if len(names) > most else "")


def _default_signature(graph: Graph, node):
    """What a ``PlaceholderWithDefault`` may be fed: its dtype, and its declared shape — or,
    where it declares no rank, the shape of its default's producer."""
    shape = node.attr["shape"].shape if "shape" in node.attr else None
    if shape is None or shape.unknown_rank:
        default = graph.inputs(node.name)[0]
        try:
            shape = _output_signature(graph, graph.node(default.node), default.port)[1]
        except InputError:              # its producer's dtype cannot be known: no shape then
            shape = None
    return node.attr["dtype"].type, shape


def _remove_orphans(graph: Graph, names, keep=()) -> List[str]:
    """Remove nodes nothing reads any more (the queue behind a cut dequeue, the iterator behind
    a default), and theirs; never a node in ``keep`` (the other declared inputs)."""
    stack, removed = list(names), []
    while stack:
        name = stack.pop()
        if name in graph and name not in keep and not graph.consumers(name, control=True):
            stack.extend(parse_ref(text).node for text in graph.node(name).input)
            graph.remove([name])
            removed.append(name)
    return removed


def _output_signature(graph: Graph, node, port: int):
    """(dtype enum, TensorShapeProto or None) of a node's output, as TensorFlow defines it: the
    dtype from the op's definition (its output arg's type or type attribute — ``DecodeWav`` has
    no ``dtype`` attribute at all), the shape from TensorFlow's shape inference of the node and
    what it reads (a dequeue's constant ``n`` included). Attributes are the fallback only where
    the graph cannot be imported (an op this TensorFlow does not know)."""
    inferred = _inferred_signature(graph, node.name, port)
    if inferred is not None and inferred[1] is not None:
        return inferred
    dtype, shape = _attribute_signature(graph, node, port, inferred is None)
    return (dtype if inferred is None else inferred[0]), _with_dequeue_batch(graph, node, shape)


def _with_dequeue_batch(graph: Graph, node, shape):
    """A dequeue of a constant ``n`` rows has batch ``n`` (shape inference loses a queue's
    component shapes through its resource handle; the queue's ``shapes`` attribute has them)."""
    if shape is None or not shape.dim or shape.dim[0].size >= 0 or \
            not node.op.startswith("QueueDequeueMany"):
        return shape
    n = graph.const_value(graph.inputs(node.name)[1])
    if n is None or np.ndim(n) != 0 or int(n) <= 0:
        return shape
    batched = tensor_shape_pb2.TensorShapeProto()
    batched.CopyFrom(shape)                # never edit the (shared) node's own attribute
    batched.dim[0].size = int(n)
    return batched


def _inferred_signature(graph: Graph, name: str, port: int):
    import tensorflow as tf
    from tfsurgery.tfsession import shape_stand_ins
    needed = graph.ancestors([name])
    graph_def = tf.compat.v1.GraphDef()
    graph_def.node.extend(shape_stand_ins(graph.node(n) for n in needed))
    if graph.library() is not None:
        graph_def.library.CopyFrom(graph.library())
    try:
        with tf.Graph().as_default() as imported:
            tf.compat.v1.import_graph_def(graph_def, name="")
            tensor = imported.get_tensor_by_name(f"{name}:{port}")
    except (ValueError, TypeError, KeyError, tf.errors.OpError):
        return None
    shape = tensor.shape.as_proto() if tensor.shape.rank is not None else None
    return tensor.dtype.as_datatype_enum, shape


def _attribute_signature(graph: Graph, node, port: int, need_dtype: bool = True):
    for key in ("component_types", "output_types", "Tout"):
        if key in node.attr and len(node.attr[key].list.type) > port:
            dtype = node.attr[key].list.type[port]
            break
    else:
        key = next((k for k in ("dtype", "T", "out_type") if k in node.attr), None)
        if key is None and not need_dtype:
            dtype = None
        elif key is None:
            raise InputError(f"input '{node.name}:{port}': the dtype of {node.op}'s output "
                             "cannot be known (TensorFlow cannot import this part of the "
                             "graph, and the op has no dtype attribute)")
        else:
            dtype = node.attr[key].type
    shapes = list(node.attr["_output_shapes"].list.shape) if "_output_shapes" in node.attr else []
    if len(shapes) > port:
        return dtype, shapes[port]
    if "output_shapes" in node.attr and len(node.attr["output_shapes"].list.shape) > port:
        return dtype, node.attr["output_shapes"].list.shape[port]
    queue = _queue_of(graph, node)
    if queue is not None and len(queue.attr["shapes"].list.shape) > port:
        shape = tensor_shape_pb2.TensorShapeProto()
        if node.op.startswith("QueueDequeueMany") or node.op.startswith("QueueDequeueUpTo"):
            shape.dim.add(size=-1)
        shape.dim.extend(queue.attr["shapes"].list.shape[port].dim)
        return dtype, shape
    return dtype, None


def _queue_of(graph: Graph, node):
    inputs = graph.inputs(node.name)
    if not inputs or not node.op.startswith("QueueDequeue"):
        return None
    return graph.node(inputs[0].node)


def _set_shape(node, dims) -> None:
    shape = node.attr["shape"].shape
    shape.Clear()
    for size in dims:
        shape.dim.add(size=-1 if size is None else int(size))


def check_fed(graph_def, inputs: Sequence[str], outputs: Sequence[str]) -> None:
    """Outputs that depend on a queue or iterator need an input named in front of it: the
    ``PlaceholderWithDefault`` that wraps it (the input the graph was written for), else the
    dequeue itself."""
    graph = {node.name: node for node in graph_def.node}    # a walk needs no full index
    cut = {node_name(n) for n in inputs}
    stack, seen = [(node_name(o), None) for o in outputs], set()
    while stack:
        name, wrapper = stack.pop()
        if name in seen or name in cut or name not in graph:
            continue
        seen.add(name)
        op = graph[name].op
        if op in QUEUE_OPS:
            raise InputError(_unfed_queue_message(op, name, wrapper))
        if op == "PlaceholderWithDefault":
            wrapper = name
        stack.extend((ref.node, wrapper) for ref in map(parse_ref, graph[name].input))


def _unfed_queue_message(op: str, name: str, wrapper: Optional[str]) -> str:
    where = f"the outputs read {op} '{name}', fed by an input queue that is empty outside training"
    if wrapper is not None:
        return (f"{where}, as the default of PlaceholderWithDefault '{wrapper}'; feed that: "
                f"pass --inputs {wrapper}")
    return (f"{where}; pass it with --inputs {name} "
            "(and --input-shape if its shape is not declared)")
