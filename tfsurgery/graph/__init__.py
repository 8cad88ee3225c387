"""The graph a transform edits, split by job (each module reads alone):

- ``index``: ``Graph``, the name/consumer/op index over a GraphDef and its edits;
- ``integrity``: the structure check, incremental after edits (topological positions, producers
  to recheck) and from scratch; ``check_structure`` for a GraphDef as loaded;
- ``order``: order and reachability (ancestors, prune, topological order), a mixin of ``Graph``;
- ``library``: the function library (and ``Graph``'s methods over it);
- ``tensors``: Const values decoded and encoded as TensorFlow does;
- ``opdefs``: what TensorFlow's op registry says about a node (outputs, attribute kinds);
- ``refs``: the input-string grammar (``"a"``, ``"a:1"``, ``"^a"``) and colocation names.

Everything is importable from here, as ``from tfsurgery.graph import Graph, Ref, ...``.
"""
from tfsurgery.errors import GraphError
from tfsurgery.graph.index import CACHED_VALUE_BYTES, Graph, gc_paused
from tfsurgery.graph.integrity import BACK_EDGE_OPS, StructureProof, check_structure, kahn
from tfsurgery.graph.library import FunctionLibrary, called_by
from tfsurgery.graph.opdefs import attr_value, check_attr_kinds, num_outputs, op_def, python_value
from tfsurgery.graph.refs import (COLOCATION_ATTR, COLOCATION_PREFIX, Consumer, Ref,
                                  colocation_targets, format_ref, parse_ref)
from tfsurgery.graph.tensors import PACKED_DTYPES, decode_tensor, encode_tensor, tensor_nbytes

__all__ = [
    "BACK_EDGE_OPS", "CACHED_VALUE_BYTES", "COLOCATION_ATTR", "COLOCATION_PREFIX", "Consumer",
    "FunctionLibrary", "Graph", "GraphError", "PACKED_DTYPES", "Ref", "StructureProof",
    "attr_value", "called_by", "check_attr_kinds", "check_structure", "colocation_targets",
    "decode_tensor", "encode_tensor", "format_ref", "gc_paused", "kahn", "num_outputs",
    "op_def", "parse_ref", "python_value", "tensor_nbytes",
]
