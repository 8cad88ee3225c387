"""What TensorFlow's op registry says about a node: how many outputs it has, which kind of value
each attribute must hold, and Python values turned into ``AttrValue``s.

Each op's definition is looked up once. An op TensorFlow does not know (a custom op whose library
is not loaded) has no definition: its outputs are not counted and its attributes not checked, and
it is asked about again next time (the library may load later).
"""
from __future__ import annotations

import functools
from typing import Dict, Optional, Tuple

from tensorflow.core.framework import attr_value_pb2, node_def_pb2

from tfsurgery.errors import GraphError

# OpDef attribute types → the AttrValue field that must hold them.
_ATTR_FIELDS = {"string": "s", "int": "i", "float": "f", "bool": "b", "type": "type",
                "shape": "shape", "tensor": "tensor", "func": "func"}


_OP_DEFS: Dict[str, object] = {}


def op_def(op: str):
    """TensorFlow's OpDef of ``op`` (None for an op it does not know), looked up once per op."""
    found = _OP_DEFS.get(op)
    if found is None:
        from tensorflow.python.framework import op_def_registry
        found = op_def_registry.get(op)
        if found is not None:           # unknown ops are asked again: a library may load later
            _OP_DEFS[op] = found
    return found


@functools.lru_cache(maxsize=None)
def _attr_kinds_of(op: str) -> Tuple[Tuple[str, str, str], ...]:
    kinds = []
    for attr in op_def(op).attr:
        wanted = "list" if attr.type.startswith("list(") else _ATTR_FIELDS.get(attr.type)
        if wanted is not None:
            kinds.append((attr.name, wanted, attr.type))
    return tuple(kinds)


def _attr_kinds(op: str) -> Tuple[Tuple[str, str, str], ...]:
    """(attribute, AttrValue field it must hold, its OpDef type) for each attribute ``op``
    defines with a known kind; empty for ops this TensorFlow does not know."""
    kinds = _KINDS.get(op)              # one dict lookup per node on the indexing path
    if kinds is None:
        if op_def(op) is None:
            return ()                   # asked again next time: a library may load later
        kinds = _KINDS[op] = _attr_kinds_of(op)
    return kinds


_KINDS: Dict[str, Tuple[Tuple[str, str, str], ...]] = {}


def check_attr_kinds(node: node_def_pb2.NodeDef, attrs=None, op: Optional[str] = None) -> None:
    """Each attribute the op defines holds a value of the kind its definition says
    (``attrs``, ``op``: ``node.attr``, ``node.op`` if the caller has them already)."""
    attrs = node.attr if attrs is None else attrs
    for name, wanted, type_ in _attr_kinds(node.op if op is None else op):
        if name not in attrs:
            continue
        held = attrs[name].WhichOneof("value")
        if held is not None and held != wanted:
            raise GraphError(f"node '{node.name}' ({node.op}): attribute '{name}' should be "
                             f"a {type_}, not a {held}")


def _output_args(op: str):
    """Per output argument of ``op``: its number attr, its type-list attr (or ""); None for an
    unknown op."""
    definition = op_def(op)
    return None if definition is None else _output_args_of(op)


@functools.lru_cache(maxsize=None)
def _output_args_of(op: str):
    return tuple((arg.number_attr, arg.type_list_attr) for arg in op_def(op).output_arg)


def num_outputs(node: node_def_pb2.NodeDef) -> Optional[int]:
    """How many outputs a node has, from its op's definition (None for unknown ops)."""
    args = _output_args(node.op)
    if args is None:
        return None
    count = 0
    for number_attr, type_list_attr in args:
        if number_attr:
            count += node.attr[number_attr].i
        elif type_list_attr:
            count += len(node.attr[type_list_attr].list.type)
        else:
            count += 1
    return count


def attr_value(value) -> attr_value_pb2.AttrValue:
    """Plain Python/TF values → AttrValue (for ``Graph.new_node``)."""
    if isinstance(value, bool):
        return attr_value_pb2.AttrValue(b=value)
    if isinstance(value, int):
        return attr_value_pb2.AttrValue(i=value)
    if isinstance(value, float):
        return attr_value_pb2.AttrValue(f=value)
    if isinstance(value, str):
        return attr_value_pb2.AttrValue(s=value.encode())
    if isinstance(value, bytes):
        return attr_value_pb2.AttrValue(s=value)
    import tensorflow as tf
    if isinstance(value, tf.dtypes.DType):
        return attr_value_pb2.AttrValue(type=value.as_datatype_enum)
    raise TypeError(f"cannot make an attribute from {value!r}")


def python_value(value: attr_value_pb2.AttrValue, default=None):
    """An AttrValue as a Python value: str for bytes, ``tf.DType``, ``tf.TensorShape``, a list
    (of ints, else strs, else floats), or the scalar it holds (``default`` if it holds nothing)."""
    kind = value.WhichOneof("value")
    if kind == "s":
        return value.s.decode(errors="replace")
    if kind == "type":
        import tensorflow as tf
        return tf.dtypes.as_dtype(value.type)
    if kind == "shape":
        import tensorflow as tf
        return tf.TensorShape(value.shape)
    if kind == "list":
        return list(value.list.i) or [s.decode() for s in value.list.s] or list(value.list.f)
    return getattr(value, kind) if kind else default
