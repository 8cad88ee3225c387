"""The Python API the CLI is a thin shell over: load → optimize (+ verify) → save."""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import List, Optional, Sequence

from tensorflow.core.framework import graph_pb2

from tfsurgery import io, pipeline, report, verify as verify_mod
from tfsurgery.pipeline import Options, TransformReport

DEMO_NAME = "article_cnn"
LARGE_GRAPH = 20_000          # above this many nodes, long steps say what they are doing
log = logging.getLogger("tfsurgery")


def progress(graph_def, message: str) -> None:
    """Progress for long steps: shown by default on large graphs, with -v always."""
    large = len(graph_def.node) > LARGE_GRAPH
    log.log(logging.INFO if large else logging.DEBUG, message)


@dataclasses.dataclass
class Source:
    """A loaded graph and what is known of its interface."""

    graph_def: graph_pb2.GraphDef
    label: str
    path: Optional[Path] = None
    inputs: List[str] = dataclasses.field(default_factory=list)
    outputs: List[str] = dataclasses.field(default_factory=list)
    training_flags: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Result:
    graph_def: graph_pb2.GraphDef
    reports: List[TransformReport]
    inputs: List[str]
    outputs: List[str]
    training_flags: List[str]
    before: graph_pb2.GraphDef
    verification: Optional[verify_mod.Verification] = None
    verification_error: Optional[str] = None

    def as_report(self) -> dict:
        extra = {"training_flags": self.training_flags}
        if self.verification_error:
            extra["verification_error"] = self.verification_error
        return report.build_report(self.before, self.graph_def, self.reports, inputs=self.inputs,
                                   outputs=self.outputs, verification=self.verification,
                                   extra=extra)


def load(path, signature: str = "serving_default") -> Source:
    """A frozen .pb/.pbtxt, a SavedModel directory (``signature``) or a .keras/.h5 file."""
    path = Path(path)
    loaded = io.load_model(path, signature)
    return Source(loaded.graph_def, label=path.name, path=path, inputs=loaded.inputs,
                  outputs=loaded.outputs)


def demo() -> Source:
    """The embedded demo: the article's CNN (TF1 style, conds on a training flag)."""
    from models.tf1 import article_cnn
    built = article_cnn()
    return Source(built.graph_def, label=f"demo model '{DEMO_NAME}'", inputs=built.inputs,
                  outputs=built.outputs,
                  training_flags=[built.training_flag] if built.training_flag else [])


def default_output_path(source: Source) -> Path:
    if source.path is None:
        return Path.cwd() / f"{DEMO_NAME}_optimized.pb"
    stem = source.path.name if source.path.is_dir() else source.path.stem
    suffix = ".pbtxt" if source.path.suffix.lower() == ".pbtxt" else ".pb"
    return source.path.with_name(f"{stem}_optimized{suffix}")


def choose_transforms(names: Sequence[str] = (), *, bn_fold: bool = False) -> List[str]:
    return pipeline.resolve_transforms(list(names), bn_fold=bn_fold)


def optimize(source: Source, transforms: Sequence[str], *, inputs: Sequence[str] = (),
             outputs: Sequence[str] = (), training_flags: Sequence[str] = (),
             verify: bool = True, tolerance: Optional[float] = None, seed: int = 0) -> Result:
    """Run ``transforms`` on the source graph, then (optionally) check the numbers."""
    from transforms.freeze_training_flags import find_training_flags
    flags = list(dict.fromkeys(list(training_flags) + source.training_flags))
    inputs, outputs = io.resolve_interface(source.graph_def, list(inputs) or source.inputs,
                                           list(outputs) or source.outputs, flags)
    options = Options(inputs=inputs, outputs=outputs, training_flags=flags)
    progress(source.graph_def, f"optimizing {len(source.graph_def.node)} nodes: "
                               f"{', '.join(transforms)}")
    try:
        graph_def, reports = pipeline.run(source.graph_def, transforms, options)
    except pipeline.TransformError as error:
        raise io.InputError(str(error)) from None
    detected_flags = find_training_flags(source.graph_def, flags)
    result = Result(graph_def, reports, inputs, outputs, detected_flags, source.graph_def)
    if verify:
        progress(source.graph_def, "verifying: running the original and the optimized graph")
        try:
            result.verification = check(source.graph_def, result, options,
                                        tolerance=verify_mod.DEFAULT_TOLERANCE
                                        if tolerance is None else tolerance, seed=seed)
        except verify_mod.VerificationError as error:
            result.verification_error = str(error)
    return result


def check(original, result: Result, options: Options, *, tolerance: float,
          seed: int = 0) -> verify_mod.Verification:
    """Verify ``result`` against the original. If dropout outside a cond was removed, the original
    is random; the reference is then the original with only that dropout turned off."""
    dropout = next((r for r in result.reports if r.name == "remove-dropout" and r.rewritten), None)
    reference, note = original, None
    if dropout is not None:
        reference, _ = pipeline.run(original, ["remove-dropout"], options)
        note = "original graph with dropout as identity, training flags False"
    try:
        return verify_mod.verify(reference, result.graph_def, result.inputs, result.outputs,
                                 result.training_flags, tolerance=tolerance, seed=seed,
                                 reference_note=note)
    except verify_mod.OriginalDoesNotRun as error:
        raise io.InputError(str(error)) from None


def save(graph_def, path, *, input_path=None) -> Path:
    return io.save_graph_def(graph_def, path, input_path=input_path)


def write_json(path, data: dict, *, input_path=None) -> None:
    path = Path(path)
    if input_path is not None and path.exists() and path.resolve() == Path(input_path).resolve():
        raise io.InputError(f"{path}: refusing to overwrite the input file")
    io.write_atomically(path, (json.dumps(data, indent=2, default=str) + "\n").encode())
