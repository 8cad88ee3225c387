"""What a run starts from: a loaded graph and what is known of its interface (``Source``),
loaded from a path, a GraphDef or the embedded demo; where its outputs go by default."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

from tensorflow.core.framework import graph_pb2

from tfsurgery import io, progress
from tfsurgery.errors import InputError
from tfsurgery.trust import keras as keras_trust
from tfsurgery.trust import outside
from tfsurgery.export import savedmodel as savedmodel_export

if TYPE_CHECKING:
    from tfsurgery.result import Result

DEMO_NAME = "article_cnn"


@dataclasses.dataclass
class Source:
    """A loaded graph and what is known of its interface."""

    graph_def: graph_pb2.GraphDef
    label: str
    path: Optional[Path] = None
    inputs: List[str] = dataclasses.field(default_factory=list)
    outputs: List[str] = dataclasses.field(default_factory=list)
    training_flags: List[str] = dataclasses.field(default_factory=list)
    signature: dict = dataclasses.field(default_factory=dict)   # a SavedModel's (io.Loaded)
    frozen_form: str = ""          # how a SavedModel/Keras model was frozen (io.Loaded)
    trust_notes: List[str] = dataclasses.field(default_factory=list)   # io.Loaded's
    # ops acting outside the graph allowed when it was loaded (load(..., allow_ops=...)):
    # optimizing it allows them too
    allowed_ops: List[str] = dataclasses.field(default_factory=list)


def load(path, signature: str = "serving_default", *, trust: bool = False,
         imports: Sequence[str] = (), allow_ops: Sequence[str] = ()) -> Source:
    """A frozen .pb/.pbtxt, a SavedModel directory (``signature``) or a .keras/.h5 file.
    ``imports``: the modules (names or .py paths) defining a Keras model's custom layers,
    imported first; ``trust``: load a Keras file holding Python code (a Lambda's), which is
    otherwise refused with ``UnsafeModel``. Both are recorded in the report. ``allow_ops``: ops
    acting outside the graph (``ReadFile``, ...; tfsurgery.trust.outside) that a SavedModel may hold
    and that optimizing this source may run; otherwise ``UnsafeModel``."""
    path = Path(path)
    progress.say(f"loading {path}")
    with outside.allowing(allow_ops):
        loaded = io.load_model(path, signature, trust=trust, imports=list(imports))
    return Source(loaded.graph_def, label=path.name, path=path, inputs=loaded.inputs,
                  outputs=loaded.outputs, signature=loaded.signature,
                  frozen_form=loaded.frozen_form, trust_notes=loaded.trust_notes,
                  allowed_ops=sorted(set(allow_ops)))


@dataclasses.dataclass
class Scanned:
    """A SavedModel or Keras file read from its protos or config, not loaded (loading runs a
    SavedModel's initializers and a Keras file's layers): what ``inspect`` shows without
    ``--load``."""

    label: str
    lines: List[str]                                    # what it holds, one line each
    findings: List[outside.Finding] = dataclasses.field(default_factory=list)


def scan(path) -> Optional[Scanned]:
    """``path`` read without loading it: a SavedModel's graphs, signatures and every node that
    may not run (tfsurgery.trust.outside); a Keras file's config (stored Python code refused:
    ``UnsafeModel``). None for a frozen GraphDef (loading one only parses it)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_dir() and ((path / "saved_model.pb").exists() or
                          (path / "saved_model.pbtxt").exists()):
        saved = io.read_saved_model(path)
        return Scanned(path.name, _saved_model_lines(saved),
                       outside.find_in_saved_model(saved, path))
    if path.suffix.lower() in io.KERAS_SUFFIXES:
        config = keras_trust.read_config(path)
        keras_trust.refuse_unsafe(path, config)
        layers = [item for item, _ in keras_trust.walk(config or {})
                  if "class_name" in item and isinstance(item.get("config"), dict)]
        return Scanned(path.name, [f"a Keras file: {len(layers)} objects in its config, no "
                                   "stored Python code"])
    return None


def _saved_model_lines(saved) -> List[str]:
    lines = []
    for meta in saved.meta_graphs:
        tags = ",".join(meta.meta_info_def.tags) or "(no tags)"
        lines.append(f"meta graph [{tags}]: {len(meta.graph_def.node)} nodes, "
                     f"{len(meta.graph_def.library.function)} functions")
        for key, signature in sorted(meta.signature_def.items()):
            lines.append(f"  signature {key}: {', '.join(sorted(signature.inputs)) or '-'} → "
                         f"{', '.join(sorted(signature.outputs)) or '-'}")
    return lines


def as_source(model, *, trust: bool = False, imports: Sequence[str] = ()) -> Source:
    """A Source from what a user has: a Source, a path (.pb/.pbtxt, SavedModel, .keras/.h5;
    ``trust``/``imports`` as :func:`load`) or a GraphDef (inputs and outputs detected)."""
    if isinstance(model, Source):
        return model
    if isinstance(model, (str, os.PathLike)):
        return load(model, trust=trust, imports=imports)
    if isinstance(model, graph_pb2.GraphDef):
        return Source(model, label="graph")
    raise TypeError(f"optimize takes a path, a GraphDef or an api.Source, not "
                    f"{type(model).__name__}")


def demo() -> Source:
    """The embedded demo: the article's CNN (TF1 style, conds on a training flag)."""
    from tfsurgery.models.tf1 import article_cnn      # the demo is built on demand only
    built = article_cnn()
    return Source(built.graph_def, label=f"demo model '{DEMO_NAME}'", inputs=built.inputs,
                  outputs=built.outputs,
                  training_flags=[built.training_flag] if built.training_flag else [])


def default_output_path(source: Source) -> Path:
    """``<input stem>_optimized.pb`` (or ``.pbtxt``) beside the input; for the demo, here."""
    if source.path is None:
        return Path.cwd() / f"{DEMO_NAME}_optimized.pb"
    suffix = ".pbtxt" if source.path.suffix.lower() == ".pbtxt" else ".pb"
    return source.path.with_name(f"{_stem(source)}_optimized{suffix}")


def default_onnx_path(source: Source) -> Path:
    """``<input stem>.onnx`` beside the input; for the demo, here."""
    if source.path is None:
        return Path.cwd() / f"{DEMO_NAME}.onnx"
    return source.path.with_name(f"{_stem(source)}.onnx")


def _stem(source: Source) -> str:
    return source.path.name if source.path.is_dir() else source.path.stem


def signature_for(source: Source, result: Result) -> savedmodel_export.Signature:
    """A SavedModel input's own signature key, and its names for the tensors it names;
    otherwise ``serving_default`` with the graph's input and output names."""
    if source.signature:
        return savedmodel_export.Signature.kept(source.signature, result.inputs, result.outputs)
    return savedmodel_export.Signature.of_graph(result.inputs, result.outputs)
