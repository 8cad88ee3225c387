"""TensorList loops as TensorArray loops, for tf2onnx (ONNX export only).

TF2 freezing *with lowering* (``convert_variables_to_constants_v2``'s default, the form Android
apps ship) turns a Keras LSTM/GRU's functional ``While`` into a v1 loop (Enter/Merge/Switch/
NextIteration/Exit) whose sequences are TensorLists. tf2onnx converts TensorList ops only inside a
functional ``While``, and v1 loops only over TensorArrays (TF1 ``dynamic_rnn``): such a graph
comes out with ``TensorListReserve``/``TensorListSetItem`` left in (its own command writes a
model onnxruntime cannot load). Each list op has a TensorArray twin, so the loop is rewritten in
the TF1 form before conversion; the ONNX model is then checked against TensorFlow as always.

    TensorListReserve(shape, n)          → TensorArrayV3(n)                      (handle, flow)
    TensorListFromTensor(t, shape)       → TensorArrayV3(len t) + TensorArrayScatterV3(all, t)
    TensorListGetItem(list, i, shape)    → TensorArrayReadV3(handle, i, flow)
    TensorListSetItem(list, i, x)        → TensorArrayWriteV3(handle, i, x, flow)   → flow
    TensorListStack(list, shape)         → TensorArrayGatherV3(handle, 0..size, flow)

The list value the loop carries (variant) becomes the array's flow (float); the handle enters
the loop frame through a constant ``Enter``, and so does an unstacked input's flow (tf2onnx's
scan-input form). A one-element list overwritten every step (a Keras layer without
``return_sequences`` keeps its last output so) becomes an append, stacked as its last element:
TensorArrays are written once per index. A loop that runs zero times (sequence length 0) leaves
that list's element unset, and TensorFlow stacks it as zeros when the element shape is fully
known (a fixed batch size): the stack then starts with that zero element, so the last element is
exact for every trip count. With an unknown batch size TensorFlow itself refuses to stack the
unset element, as the TensorArray form (and onnxruntime) refuses an empty stack. Only this vocabulary, lists created outside the
loop and one loop level are handled; anything else leaves the graph as it was.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.framework.attr_value_pb2 import AttrValue

from tfsurgery.graph import Graph, Ref

CREATORS = frozenset({"TensorListReserve", "TensorListFromTensor"})
USERS = frozenset({"TensorListGetItem", "TensorListSetItem", "TensorListStack"})
CARRIERS = frozenset({"Enter", "Merge", "Switch", "Identity", "NextIteration", "Exit"})


def as_tensor_arrays(graph_def):
    """The graph with every supported TensorList loop rewritten (see module doc); the graph
    unchanged when it holds a list op this cannot rewrite."""
    graph = Graph(graph_def, check_inputs=False)
    creators = [n.name for n in graph if n.op in CREATORS]
    if not creators or any(n.op.startswith("TensorList") and n.op not in CREATORS | USERS
                           for n in graph):
        return graph_def
    families = [_family(graph, name) for name in creators]
    if any(family is None for family in families):
        return graph_def
    for creator, family in zip(creators, families):
        _rewrite(graph, creator, family)
    return graph.to_graph_def()


def _family(graph: Graph, creator: str) -> Optional[Dict[str, int]]:
    """Every node carrying the list created by ``creator`` → its loop depth (0 outside the loop,
    1 inside); None if the list goes anywhere this cannot follow."""
    depth = {creator: 0}
    stack = [creator]
    while stack:
        name = stack.pop()
        for consumer in graph.consumers(name):
            node = graph.node(consumer.node)
            if node.op in USERS and consumer.index != 0:
                return None                           # a list as an item: not ours
            if node.op not in CARRIERS | USERS or node.op == "Merge" and \
                    any(ref.node not in depth and graph.op(ref) != "NextIteration"
                        for ref in graph.inputs(node.name)):
                return None
            level = depth[name] + (node.op == "Enter") - (node.op == "Exit")
            if level not in (0, 1) or depth.get(consumer.node, level) != level:
                return None
            if consumer.node not in depth:
                depth[consumer.node] = level
                if node.op not in ("TensorListGetItem", "TensorListStack"):
                    stack.append(consumer.node)
    users_ok = all(level == (graph.op(name) != "TensorListStack")
                   for name, level in depth.items() if graph.op(name) in USERS)
    return depth if users_ok else None


def _rewrite(graph: Graph, creator: str, family: Dict[str, int]) -> None:
    node = graph.node(creator)
    dtype = tf.dtypes.as_dtype(node.attr["element_dtype"].type)
    base = graph.unique_name(f"{creator}/tensor_array")
    slot = _single_slot(graph, creator, family)
    element = _element_shape(graph, creator, family)
    # a slot the loop never wrote (zero steps) stacks as zeros in TensorFlow
    unset = np.zeros([1] + element, dtype.as_numpy_dtype) if slot and element else None
    handle, flow = _create(graph, node, base, dtype, slot, element)
    inner = _in_loop(graph, family, handle, f"{base}/handle_enter", tf.resource)
    # an unstacked input is read, never written: its flow enters the loop as a constant, the
    # form tf2onnx's loop rewriter turns into a scan input
    read_flow = _in_loop(graph, family, flow, f"{base}/flow_enter", tf.float32) \
        if node.op == "TensorListFromTensor" else None
    graph.rewire(creator, flow, keep=[f"{base}/flow_enter"])
    graph.move_control_consumers(creator, base)
    graph.remove([creator])
    for name, level in family.items():
        if name == creator:
            continue
        op = graph.op(name)
        if op in CARRIERS:
            graph.edit_node(name).attr["T"].type = tf.float32.as_datatype_enum
        else:
            _replace_user(graph, name, handle if level == 0 else inner, dtype,
                          read_flow if op == "TensorListGetItem" else None, slot, unset,
                          element)


def _single_slot(graph: Graph, creator: str, family: Dict[str, int]) -> bool:
    """A one-element list every step overwrites at a constant index (a Keras LSTM without
    ``return_sequences`` keeps its last output so). A TensorArray is written once per index:
    each step appends instead, and the stack after the loop keeps the last element."""
    writes = [n for n in family if graph.op(n) == "TensorListSetItem"]
    size = graph.const_value(graph.inputs(creator)[1]) \
        if graph.op(creator) == "TensorListReserve" else None
    return size is not None and int(size) == 1 and bool(writes) and \
        all(graph.is_const(graph.inputs(n)[1]) for n in writes) and \
        not any(graph.op(n) == "TensorListGetItem" for n in family)


def _element_shape(graph: Graph, creator: str, family: Dict[str, int]) -> Optional[list]:
    """The list's element shape where the creator's and the stacks' constant shapes together fix
    every dimension, else None."""
    shapes = [graph.const_value(graph.inputs(name)[index])
              for name, index in [(creator, 0 if graph.op(creator) == "TensorListReserve" else 1)]
              + [(n, 1) for n in family if graph.op(n) == "TensorListStack"]]
    if any(shape is None or shape.ndim != 1 for shape in shapes) or \
            len({shape.size for shape in shapes}) != 1:
        return None                                   # unknown rank, or not a constant
    dims = np.max(np.stack(shapes), axis=0)           # -1 is unknown: a known dim wins
    return None if (dims < 0).any() else dims.tolist()


def _known_shape(shape: Optional[list]) -> dict:
    """The ``element_shape`` attribute of a TensorArray op, when the shape is known: an empty
    array (a loop run zero times) then stacks as TensorFlow's list does."""
    return {} if shape is None else {
        "element_shape": AttrValue(shape=tf.TensorShape(shape).as_proto())}


def _create(graph: Graph, node, base: str, dtype, slot: bool, element: Optional[list]):
    """The TensorArray replacing list creator ``node``: (handle, flow holding its content)."""
    if slot:
        size = Ref(graph.add_const(f"{base}/size", np.array(0, np.int32)), 0)
    elif node.op == "TensorListReserve":
        size = graph.inputs(node.name)[1]
    else:
        size = _leading_dim(graph, graph.inputs(node.name)[0], dtype, base)
    graph.new_node("TensorArrayV3", base, [size], {
        "dtype": dtype, "dynamic_size": slot, "clear_after_read": True,
        "identical_element_shapes": True, "tensor_array_name": "", **_known_shape(element)})
    handle, flow = Ref(base, 0), Ref(base, 1)
    if node.op == "TensorListFromTensor":
        indices = _range(graph, size, f"{base}/indices")
        graph.new_node("TensorArrayScatterV3", f"{base}/scatter",
                       [handle, indices, graph.inputs(node.name)[0], flow], {"T": dtype})
        flow = Ref(f"{base}/scatter", 0)
    return handle, flow


def _in_loop(graph: Graph, family: Dict[str, int], value: Ref, name: str, dtype) -> Ref:
    """``value`` inside the family's loop frame: a constant Enter like the family's own."""
    enter = next((n for n in family if graph.op(n) == "Enter"), None)
    if enter is None:
        return value
    attrs = graph.node(enter).attr
    graph.new_node("Enter", name, [value], {
        "T": dtype, "frame_name": attrs["frame_name"], "is_constant": True,
        "parallel_iterations": attrs["parallel_iterations"]})
    return Ref(name, 0)


def _replace_user(graph: Graph, name: str, handle: Ref, dtype, read_flow: Optional[Ref],
                  slot: bool, unset: Optional[np.ndarray], element: Optional[list]) -> None:
    """A list op → its TensorArray twin under the same name (consumers stay valid)."""
    node = graph.node(name)
    inputs = graph.inputs(name)
    controls = [f"^{c}" for c in graph.control_inputs(name)]
    graph.remove([name])
    if node.op == "TensorListGetItem":
        flow = inputs[0] if read_flow is None else read_flow
        graph.new_node("TensorArrayReadV3", name, [handle, inputs[1], flow] + controls,
                       {"dtype": dtype})
    elif node.op == "TensorListSetItem":
        index = inputs[1]
        if slot:                                      # append: write at the current size
            index = Ref(graph.new_node("TensorArraySizeV3", f"{name}/append_index",
                                       [handle, inputs[0]]).name, 0)
        graph.new_node("TensorArrayWriteV3", name,
                       [handle, index, inputs[2], inputs[0]] + controls, {"T": dtype})
    else:                                                     # TensorListStack
        size = graph.new_node("TensorArraySizeV3", f"{name}/size", [handle, inputs[0]]).name
        indices = _range(graph, Ref(size, 0), f"{name}/indices")
        gathered = graph.new_node("TensorArrayGatherV3", f"{name}/gather" if slot else name,
                                  [handle, indices, inputs[0]] + controls,
                                  {"dtype": dtype, **_known_shape(element)}).name
        if slot:                                      # the last write: [1, ...] like the list
            _last(graph, gathered, name, unset)


def _last(graph: Graph, tensor: str, name: str, unset: Optional[np.ndarray]) -> None:
    """``tensor[-1:]`` named ``name``; ``concat(unset, tensor)[-1:]`` with an unset element
    (zero writes then give TensorFlow's zeros)."""
    dtype = graph.node(tensor).attr["dtype"]
    if unset is not None:
        graph.add_const(f"{name}/unset", unset)
        graph.add_const(f"{name}/axis", np.array(0, np.int32))
        tensor = graph.new_node("ConcatV2", f"{name}/with_unset",
                                [f"{name}/unset", tensor, f"{name}/axis"],
                                {"T": dtype, "N": 2,
                                 "Tidx": tf.int32}).name
    for part, value in (("begin", -1), ("end", 0), ("strides", 1)):
        graph.add_const(f"{name}/{part}", np.array([value], np.int32))
    graph.new_node("StridedSlice", name,
                   [tensor, f"{name}/begin", f"{name}/end", f"{name}/strides"],
                   {"T": dtype, "Index": tf.int32, "end_mask": 1})


def _leading_dim(graph: Graph, tensor: Ref, dtype, base: str) -> Ref:
    graph.new_node("Shape", f"{base}/shape", [tensor], {"T": dtype, "out_type": tf.int32})
    for part, value in (("begin", 0), ("end", 1), ("strides", 1)):
        graph.add_const(f"{base}/{part}", np.array([value], np.int32))
    graph.new_node("StridedSlice", f"{base}/size",
                   [f"{base}/shape", f"{base}/begin", f"{base}/end", f"{base}/strides"],
                   {"T": tf.int32, "Index": tf.int32, "shrink_axis_mask": 1})
    return Ref(f"{base}/size", 0)


def _range(graph: Graph, size: Ref, name: str) -> Ref:
    graph.add_const(f"{name}/start", np.array(0, np.int32))
    graph.add_const(f"{name}/delta", np.array(1, np.int32))
    graph.new_node("Range", name, [f"{name}/start", size, f"{name}/delta"],
                   {"Tidx": tf.int32})
    return Ref(name, 0)
