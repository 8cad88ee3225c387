"""The user's own input values (``--samples PATH``): real images, token ids, audio frames.

A samples file is either an ``.npz`` whose arrays are named by the graph's inputs, or a directory
of ``.npy`` files named by input (``dir/images.npy``; a node name with ``/`` is a sub-path:
``dir/scope/x.npy``; ``NAME:1`` may be written ``NAME__1``). Every array stacks **rows** along its
first axis; each row is one feed of its input:

- an array of the input's rank + 1 holds whole batches: row ``i`` is ``array[i]``;
- an array of the input's own rank holds single samples: row ``i`` is ``array[i:i+1]`` (a batch
  of one), so the input's first dimension must be free or 1.

All arrays must have the same number of rows. An array named ``labels`` (when no input has that
name) holds each row's true class — one integer per row, or per batch element for whole-batch
rows — for int8's accuracy (``--int8-max-accuracy-drop``); ``--labels PATH`` (.npy) gives them
from a file of their own. Inputs the file does not cover get the seeded random values as before; names that are not inputs, shapes or dtypes that do not fit, NaN/Inf,
and an empty file are refused in one line naming the file, the input and what is wrong.

Used by verification (every row checked), ``bench`` and int8 (cut into calibration, selection
and gate rows by ``int8_loop.split_rows``).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfsurgery.errors import InputError
from tfsurgery.ops import node_name, tensor_name

PORT_SEPARATOR = "__"          # "x__1.npy" names the tensor x:1 in a directory of .npy files


@dataclasses.dataclass
class InputSpec:
    """What an input accepts: its numpy dtype and its shape (None for a free dimension; None for
    an unknown rank)."""

    dtype: np.dtype
    shape: Optional[Tuple[Optional[int], ...]]


@dataclasses.dataclass
class Samples:
    """Rows of feeds: ``arrays[input][i]`` (batched) or ``arrays[input][i:i+1]`` (single)."""

    arrays: Dict[str, np.ndarray]
    batched: Dict[str, bool]
    source: str
    labels: Optional[np.ndarray] = None     # each row's true class (int8 accuracy), or None

    @property
    def rows(self) -> int:
        return len(next(iter(self.arrays.values()))) if self.arrays else 0

    @property
    def inputs(self) -> List[str]:
        return list(self.arrays)

    def row(self, index: int) -> Dict[str, np.ndarray]:
        """The feeds of row ``index``: input name → the value to feed it."""
        return {name: (array[index] if self.batched[name] else array[index:index + 1])
                for name, array in self.arrays.items()}

    def feeds(self) -> Iterator[Dict[str, np.ndarray]]:
        """Every row's feeds, in order."""
        for index in range(self.rows):
            yield self.row(index)

    def batches(self, rows: int = 1) -> Iterator[Tuple[int, Dict[str, np.ndarray]]]:
        """(first row, feeds) for runs of up to ``rows`` rows: single samples are stacked along
        the batch axis (whole-batch rows are always fed one at a time)."""
        step = rows if not any(self.batched.values()) else 1
        for first in range(0, self.rows, step):
            last = min(first + step, self.rows)
            yield first, {name: (array[first] if self.batched[name] else array[first:last])
                          for name, array in self.arrays.items()}

    def take(self, indices: Sequence[int]) -> "Samples":
        indices = np.asarray(indices, dtype=np.int64)
        return Samples({n: a[indices] for n, a in self.arrays.items()}, dict(self.batched),
                       self.source, None if self.labels is None else self.labels[indices])

    def split(self, check_fraction: float = 0.25, *, min_check: int = 8,
              seed: int = 0) -> Tuple["Samples", "Samples"]:
        """(calibration part, held-back check part): a seeded shuffle, the check part
        ``check_fraction`` of the rows and at least ``min_check``; both parts non-empty."""
        if not 0 < check_fraction < 1:
            raise InputError(f"the check fraction must be between 0 and 1, not {check_fraction}")
        check = max(min_check, int(round(self.rows * check_fraction)))
        if self.rows - check < 1:
            raise InputError(f"{self.source}: {self.rows} rows are too few to hold back "
                             f"{check} for checking and calibrate on the rest; give at least "
                             f"{check + 1} rows")
        order = np.random.default_rng(seed).permutation(self.rows)
        return self.take(order[check:]), self.take(order[:check])


def concatenate(parts: Sequence[Samples]) -> Samples:
    """The rows of ``parts`` one after the other (the same inputs, each batched alike)."""
    first = parts[0]
    for part in parts[1:]:
        if part.inputs != first.inputs or part.batched != first.batched:
            raise InputError(f"{part.source} and {first.source} do not hold the same inputs "
                             "the same way")
    labels = None if any(p.labels is None for p in parts) else \
        np.concatenate([p.labels for p in parts])
    return Samples({name: np.concatenate([p.arrays[name] for p in parts])
                    for name in first.inputs}, dict(first.batched),
                   " + ".join(p.source for p in parts), labels)


def input_specs(graph_def, inputs: Sequence[str]) -> Dict[str, InputSpec]:
    """Each input placeholder's dtype and declared shape."""
    import tensorflow as tf
    by_name = {node.name: node for node in graph_def.node}
    specs = {}
    for name in inputs:
        node = by_name.get(node_name(name))
        if node is None or "dtype" not in node.attr:
            raise InputError(f"input '{name}' is not a placeholder of the graph")
        dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
        shape = tf.TensorShape(node.attr["shape"].shape) if "shape" in node.attr else \
            tf.TensorShape(None)
        specs[name] = InputSpec(np.dtype(dtype.as_numpy_dtype),
                                None if shape.rank is None else tuple(shape.as_list()))
    return specs


LABELS = "labels"


def load(path, specs: Mapping[str, InputSpec], *, allow_nonfinite: bool = False,
         labels_path=None) -> Samples:
    """Read ``path`` (.npz or a directory of .npy) and check it against the inputs' ``specs``;
    a ``labels`` array (or ``labels_path``, an .npy) gives each row's true class."""
    path = Path(path)
    raw = _read(path)
    labels = raw.pop(LABELS) if LABELS in raw and \
        not any(_key(LABELS) == _key(name) for name in specs) else None
    if labels_path is not None:
        if labels is not None:
            raise InputError(f"{path} holds labels already; drop --labels {labels_path}")
        labels = _read_labels(Path(labels_path))
    if not raw:
        raise InputError(f"{path}: no arrays in it (name them by the graph's inputs: "
                         f"{', '.join(specs)})")
    by_node = {_key(name): name for name in specs}
    arrays, batched = {}, {}
    for key, array in raw.items():
        name = by_node.get(_key(key))
        if name is None:
            raise InputError(f"{path}: '{key}' is not an input of the graph (inputs: "
                             f"{', '.join(specs)})")
        arrays[name], batched[name] = _checked(path, name, array, specs[name], allow_nonfinite)
    rows = {name: len(array) for name, array in arrays.items()}
    if len(set(rows.values())) > 1:
        listed = ", ".join(f"{name}: {count}" for name, count in rows.items())
        raise InputError(f"{path}: the arrays must have the same number of rows ({listed})")
    if not next(iter(rows.values())):
        raise InputError(f"{path}: the arrays have no rows")
    samples = Samples(arrays, batched, str(path))
    if labels is not None:
        samples.labels = _checked_labels(path, labels, samples)
    return samples


def _read_labels(path: Path) -> np.ndarray:
    if path.suffix.lower() == ".npz":
        raw = _read(path)
        if LABELS not in raw:
            raise InputError(f"{path}: no 'labels' array in it")
        return raw[LABELS]
    if not path.exists():
        raise InputError(f"{path}: no such file")
    return _load_npy(path)


def _checked_labels(path: Path, labels: np.ndarray, samples: Samples) -> np.ndarray:
    """Integer classes, one per row (or per batch element of whole-batch rows)."""
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iub" or labels.ndim == 0:
        raise InputError(f"{path}: the labels must be integer classes, one per row "
                         f"(got {labels.dtype} shaped {list(labels.shape)})")
    if len(labels) != samples.rows:
        raise InputError(f"{path}: {len(labels)} labels for {samples.rows} rows")
    if labels.size and labels.min() < 0:
        raise InputError(f"{path}: the labels must be classes 0, 1, ... (found {labels.min()})")
    return labels.astype(np.int64)


def _key(name: str) -> str:
    """One spelling of an input name: ``x`` and ``x:0`` are the same tensor."""
    return tensor_name(name.replace(PORT_SEPARATOR, ":")) if PORT_SEPARATOR in name or \
        ":" in name else tensor_name(name)


def _read(path: Path) -> Dict[str, np.ndarray]:
    if path.is_dir():
        files = sorted(path.rglob("*.npy"))
        return {f.relative_to(path).with_suffix("").as_posix(): _load_npy(f) for f in files}
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.suffix.lower() == ".npy":
        raise InputError(f"{path}: give an .npz named by input, or a directory of .npy files "
                         "named by input (one .npy has no input name)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError) as error:
        raise InputError(f"{path}: cannot read it as .npz: {error}") from None


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise InputError(f"{path}: cannot read it as .npy: {error}") from None


def _checked(path: Path, name: str, array: np.ndarray, spec: InputSpec,
             allow_nonfinite: bool) -> Tuple[np.ndarray, bool]:
    """The array cast to the input's dtype, and whether its rows are whole batches."""
    where = f"{path}: input '{name}'"
    array = np.asarray(array)
    if array.ndim == 0:
        raise InputError(f"{where}: a scalar holds no rows; stack the values along a first axis")
    _check_dtype(where, array, spec.dtype)
    if spec.shape is None:
        batched = True               # unknown rank: each row is fed as it is
    elif array.ndim == len(spec.shape) + 1:
        batched = True
        _check_shape(where, array.shape[1:], spec.shape)
    elif array.ndim == len(spec.shape) and spec.shape:
        batched = False
        _check_shape(where, (1,) + array.shape[1:], spec.shape)
    else:
        raise InputError(f"{where}: shape {list(array.shape)} fits neither one sample per row "
                         f"nor one batch per row of an input shaped {_shown(spec.shape)}")
    if array.dtype.kind in "fc" and not allow_nonfinite and not np.all(np.isfinite(array)):
        count = int(array.size - np.count_nonzero(np.isfinite(array)))
        raise InputError(f"{where}: {count} values are NaN or infinite")
    return array.astype(spec.dtype, copy=False), batched


def _check_dtype(where: str, array: np.ndarray, dtype: np.dtype) -> None:
    """Values cast exactly: ints to floats or wider ints, floats to floats, bools, strings."""
    kind, wanted = array.dtype.kind, dtype.kind
    if kind == wanted or (wanted == "f" and kind in "iub") or \
            (wanted in "iu" and kind in "iu") or \
            (wanted in "SUO" and kind in "SUO"):
        if wanted in "iu" and kind in "iu" and array.size:
            info = np.iinfo(dtype)
            if array.min() < info.min or array.max() > info.max:
                raise InputError(f"{where}: values outside {dtype}'s range")
        return
    raise InputError(f"{where}: {array.dtype} values cannot be fed to a {dtype} input")


def _check_shape(where: str, shape: Sequence[int], wanted: Sequence[Optional[int]]) -> None:
    if len(shape) != len(wanted) or any(w is not None and w != s for s, w in zip(shape, wanted)):
        raise InputError(f"{where}: a row is shaped {list(shape)}, the input "
                         f"{_shown(wanted)}")


def _shown(shape) -> str:
    if shape is None:
        return "of unknown rank"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
