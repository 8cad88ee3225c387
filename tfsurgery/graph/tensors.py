"""Tensor values in and out of ``TensorProto``s, as TensorFlow reads and writes them.

``decode_tensor`` is ``tf.make_ndarray`` and ``encode_tensor`` is ``tf.make_tensor_proto``: same
arrays, same protos, byte for byte (tests/test_graph.py compares them with TensorFlow's own).
Both take a shortcut for the common case, an array of a dtype TensorFlow stores as packed bytes
(``tensor_content``): the bytes are viewed or copied once, without the per-call overhead of TF's
functions, which costs more than the data for small tensors.
"""
from __future__ import annotations

import functools
from typing import FrozenSet, Optional, Sequence, Tuple

import numpy as np

from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

# The dtypes ``tf.make_tensor_proto`` writes as packed bytes in ``tensor_content`` (TensorFlow
# 2.21's own list; bool, complex, string, uint16 and the resource/variant types go in the typed
# ``*_val`` fields instead). tests/test_graph.py compares this with TensorFlow's list.
PACKED_DTYPE_NAMES = (
    "DT_HALF", "DT_BFLOAT16", "DT_FLOAT", "DT_DOUBLE",
    "DT_INT8", "DT_INT16", "DT_INT32", "DT_INT64",
    "DT_UINT8", "DT_UINT32", "DT_UINT64",
    "DT_QINT8", "DT_QINT16", "DT_QINT32", "DT_QUINT8", "DT_QUINT16",
    "DT_FLOAT8_E5M2", "DT_FLOAT8_E4M3FN", "DT_FLOAT8_E4M3FNUZ", "DT_FLOAT8_E4M3B11FNUZ",
    "DT_FLOAT8_E5M2FNUZ", "DT_FLOAT4_E2M1FN",
)
PACKED_DTYPES: FrozenSet[int] = frozenset(
    getattr(types_pb2, name) for name in PACKED_DTYPE_NAMES if hasattr(types_pb2, name))


def decode_tensor(tensor: tensor_pb2.TensorProto) -> np.ndarray:
    """``tf.make_ndarray``, read-only. Its packed-bytes case is inlined (most weights): the array
    is a view of the bytes, no second copy, and make_ndarray's own overhead (dtype objects,
    np.prod) costs more than the data for small tensors."""
    content = tensor.tensor_content
    if content:             # what make_ndarray does for packed bytes, minus the copy
        shape = _dims(tensor.tensor_shape.SerializeToString())
        return np.frombuffer(content, dtype=_numpy_dtype(tensor.dtype)).reshape(shape)
    import tensorflow as tf
    value = tf.make_ndarray(tensor)
    value.flags.writeable = False
    return value


def decode_alike(tensors: Sequence[tensor_pb2.TensorProto]) -> Optional[np.ndarray]:
    """The values of packed tensors of one dtype and shape, stacked along a new first axis and
    read-only: one buffer and one array for all (a batch norm's four parameters); None unless
    every tensor is packed alike."""
    first = tensors[0]
    dtype, shape = first.dtype, first.tensor_shape.SerializeToString()
    contents = [t.tensor_content for t in tensors]
    if not all(contents) or any(t.dtype != dtype or t.tensor_shape.SerializeToString() != shape
                                for t in tensors):
        return None
    return np.frombuffer(b"".join(contents), dtype=_numpy_dtype(dtype)).reshape(
        (len(tensors),) + _dims(shape))


def encode_tensor(value, dtype=None,
                  into: Optional[tensor_pb2.TensorProto] = None) -> tensor_pb2.TensorProto:
    """``tf.make_tensor_proto(value, dtype)`` (written ``into`` that proto if given). A numpy
    array of two or more numbers of a packed type is written as make_tensor_proto writes it
    (shape and raw bytes), without its overhead and without copying the bytes twice."""
    import tensorflow as tf
    tensor = tensor_pb2.TensorProto() if into is None else into
    if isinstance(value, np.ndarray) and value.size > 1 and \
            (dtype is None or tf.dtypes.as_dtype(dtype).as_numpy_dtype == value.dtype):
        enum = _packed_enum(value.dtype)
        if enum is not None and value.nbytes < (1 << 31):
            tensor.Clear()
            tensor.dtype = enum
            dims = tensor.tensor_shape.dim
            for size in value.shape:
                dims.add(size=size)       # (in place: no Dim message built and copied in)
            tensor.tensor_content = value.tobytes()
            return tensor
    tensor.CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
    return tensor


def tensor_nbytes(tensor: tensor_pb2.TensorProto) -> int:
    """Size of a tensor's value, from its shape and dtype (no decoding)."""
    import tensorflow as tf
    count = int(np.prod([d.size for d in tensor.tensor_shape.dim], dtype=np.int64))
    return count * tf.dtypes.as_dtype(tensor.dtype).size


@functools.lru_cache(maxsize=4096)
def _dims(shape: bytes) -> Tuple[int, ...]:
    """The dims of a serialized TensorShapeProto. Graphs repeat a few shapes over and over:
    one dict lookup instead of a Python object per dim, per tensor."""
    proto = tensor_shape_pb2.TensorShapeProto.FromString(shape)
    return tuple(d.size for d in proto.dim)


@functools.lru_cache(maxsize=None)
def _numpy_dtype(enum: int) -> np.dtype:
    import tensorflow as tf
    return np.dtype(tf.dtypes.as_dtype(enum).as_numpy_dtype)


@functools.lru_cache(maxsize=None)
def _packed_enum(dtype: np.dtype) -> Optional[int]:
    """The DataType enum of a numpy dtype make_tensor_proto packs as bytes (None otherwise)."""
    import tensorflow as tf
    try:
        enum = tf.dtypes.as_dtype(dtype).as_datatype_enum
    except TypeError:
        return None
    return enum if enum in PACKED_DTYPES else None
