"""Shims for the libraries we run on, each scoped to the one place that needs it.

**tf2onnx on numpy 2.** tf2onnx 1.17 (the newest release) calls ``np.product`` in
``tf2onnx.graph`` when it moves large tensors out of the model (``large_model=True``); numpy 2
removed that alias of ``np.prod``. ``tf2onnx_on_numpy2`` hands ``tf2onnx.graph`` a view of numpy
that has it. numpy itself is untouched: no other module sees the alias.

**A file in memory.** onnxruntime writes its optimized model only to a path
(``SessionOptions.optimized_model_filepath``). ``memory_file`` gives a path backed by memory
(Linux ``memfd_create``, reached through ``/proc/self/fd``), so handing a model through
onnxruntime's optimizer touches no disk; elsewhere a temporary file stands in.

**tf2onnx's garbage graphs.** tf2onnx's optimizer loop deep-copies the whole graph, weights
included, before each of its ~20 optimizers, round after round; each copy dropped is a
reference cycle (nodes ↔ graph), freed only by Python's rare full collections. A Keras ResNet50
at 224 piled up 8.8 GB of them (3.4 GB when collected; docs/int8.md, Memory).
``tf2onnx_collecting`` makes each optimizer after a collection, through tf2onnx's own registry
of optimizers, restored afterwards; the export uses it for large graphs only
(``onnx_export.COLLECT_ABOVE_BYTES``: each collection costs ~0.1-0.3 s with TensorFlow loaded).
"""
from __future__ import annotations

import collections
import contextlib
import gc
import os
import tempfile
import types
from pathlib import Path
from typing import Iterator

import numpy as np


class _NumpyWithProduct(types.ModuleType):
    """numpy, plus the ``product`` alias numpy 2 removed (for tf2onnx's eyes only)."""

    product = staticmethod(np.prod)

    def __getattr__(self, name):
        return getattr(np, name)


def tf2onnx_on_numpy2() -> None:
    """Idempotent; a no-op where numpy still has ``product`` or tf2onnx no longer needs it."""
    import tf2onnx.graph
    if hasattr(tf2onnx.graph.np, "product"):
        return
    tf2onnx.graph.np = _NumpyWithProduct("numpy")


@contextlib.contextmanager
def tf2onnx_collecting() -> Iterator[None]:
    """Within it, tf2onnx's optimizer loop frees the graph copies it dropped before making each
    optimizer (see the module doc)."""
    from tf2onnx import optimizer
    registry = getattr(optimizer, "_optimizers", None)
    if not isinstance(registry, dict):      # another tf2onnx: converted as it comes
        yield
        return

    def collected(factory):
        def make():
            gc.collect()
            return factory()
        return make
    optimizer._optimizers = collections.OrderedDict(
        (name, collected(factory)) for name, factory in registry.items())
    try:
        yield
    finally:
        optimizer._optimizers = registry


@contextlib.contextmanager
def memory_file(name: str) -> Iterator[Path]:
    """A path to write and read back within the block; its bytes live in memory where the
    platform allows (read them with ``read_memory_file``)."""
    if hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir():
        fd = os.memfd_create(name)
        try:
            yield Path(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="tfsurgery.") as folder:
        yield Path(folder) / name


def read_memory_file(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()
