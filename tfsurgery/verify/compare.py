"""``tfsurgery compare A B``: any two graphs or artefacts on the same inputs, every common tensor
compared — the tool users reach for after someone's optimizer broke their model.

A is the reference and must be a TensorFlow model (.pb/.pbtxt, SavedModel directory,
.keras/.h5): its interface gives the inputs and outputs. B may be another TensorFlow model —
then every tensor that exists under the same name in both is compared, in B's topological order —
or an ONNX model (tf2onnx keeps TensorFlow's tensor names) or a TensorFlow Lite model (its
signature's names), whose outputs are compared. The first divergence (nearest the inputs) and the
worst are listed; the comparison passes when every compared tensor is within the tolerance.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from tfsurgery import io
from tfsurgery.verify import localize
from tfsurgery.export import onnx as onnx_export
from tfsurgery.trust import outside
from tfsurgery.verify import samples as samples_mod
from tfsurgery.verify import scales
from tfsurgery.verify import check as verify
from tfsurgery.errors import InputError
from tfsurgery.graph import Graph
from tfsurgery.interface import (find_dropout_knobs, find_training_flags, resolve_interface,
                                 with_declared_inputs)
from tfsurgery.ops import node_name, tensor_name
from tfsurgery.verify.reference import comparable_reference


@dataclasses.dataclass
class Comparison:
    a: str
    b: str
    errors: List[verify.OutputError]        # every compared tensor, nearest the inputs first
    ops: Dict[str, str]                     # tensor → op in B (TensorFlow B only)
    tolerance: float
    what: str                               # "every common tensor" or "the outputs"
    # tensors that differ but whose every compared reader matches: a legitimate rewrite (a
    # conv whose weights took a batch norm's scale, read by the node that took its shift)
    made_up_for: List[str] = dataclasses.field(default_factory=list)

    @property
    def first(self) -> Optional[verify.OutputError]:
        return next((e for e in self.errors if e.max_rel > self.tolerance and
                     e.name not in self.made_up_for), None)

    @property
    def worst(self) -> Optional[verify.OutputError]:
        return max(self.errors, key=lambda e: e.max_rel, default=None)

    @property
    def passed(self) -> bool:
        return verify.compared_real_numbers(self.errors) and self.first is None

    def lines(self) -> List[str]:
        text = [f"{self.b} against {self.a}: {len(self.errors)} tensors compared "
                f"({self.what}), tolerance {self.tolerance:g}"]
        for label, error in (("first divergence", self.first), ("worst", self.worst)):
            if error is not None and (label == "worst" or error.max_rel > self.tolerance):
                op = f" ({self.ops[error.name]})" if error.name in self.ops else ""
                text.append(f"{label}: {error.name}{op}: relative error {error.max_rel:.3g}")
        if self.made_up_for:
            text.append(f"{len(self.made_up_for)} tensors differ only inside a rewrite (their "
                        f"readers match), e.g. {self.made_up_for[0]}")
        text.append("same numbers" if self.passed else "they differ")
        return text

    def as_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "passed": self.passed, "tolerance": self.tolerance,
                "compared": self.what,
                "first": self.first.as_dict() if self.first else None,
                "worst": self.worst.as_dict() if self.worst else None,
                "tensors": [dict(e.as_dict(), op=self.ops.get(e.name)) for e in self.errors]}


def compare(a, b, *, inputs: Sequence[str] = (), outputs: Sequence[str] = (),
            feeds: Optional[Mapping[str, object]] = None,
            input_shapes: Optional[Mapping[str, Sequence[Optional[int]]]] = None,
            samples=None, tolerance: float = verify.DEFAULT_TOLERANCE,
            timeout: float = verify.DEFAULT_TIMEOUT, seed: int = 0, trust: bool = False,
            imports: Sequence[str] = ()) -> Comparison:
    a, b = Path(a), Path(b)
    if a.suffix.lower() in (".onnx", ".tflite"):
        raise InputError(f"{a}: the first model is the reference and must be a TensorFlow "
                         "graph (.pb/.pbtxt, SavedModel, .keras/.h5)")
    loaded = io.load_model(a, trust=trust, imports=imports)
    reference = loaded.graph_def
    if input_shapes:
        reference = with_declared_inputs(reference, list(inputs) or loaded.inputs,
                                         dict(input_shapes))
    flags = find_training_flags(reference)                 # fed False, as verification does
    knobs = find_dropout_knobs(reference, exclude=list(inputs))
    inputs, outputs = resolve_interface(reference, list(inputs) or loaded.inputs,
                                        list(outputs) or loaded.outputs, flags)
    inputs = [name for name in inputs if node_name(name) not in knobs]
    settings = {**{name: np.bool_(False) for name in flags},
                **{name: np.asarray(value, np.float32) for name, value in knobs.items()}}
    outside.refuse(reference, outputs, [*inputs, *settings], where=str(a))   # before any run
    given = dict(feeds or {})
    if samples is not None:
        rows = samples_mod.load(samples, samples_mod.input_specs(reference, inputs))
        given = {**next(rows.batches(1))[1], **given}
    values = {**verify.make_feeds(reference, inputs, seed, given=given), **settings}
    if b.suffix.lower() == ".onnx":
        return _against_outputs(reference, values, outputs, tolerance, timeout, a, b,
                                onnx_export.run_onnx(b, {tensor_name(k): v for k, v in
                                                         values.items()}, outputs,
                                                     timeout=timeout))
    if b.suffix.lower() == ".tflite":
        return _against_outputs(reference, values, outputs, tolerance, timeout, a, b,
                                _run_tflite(b, values, outputs))
    other = io.load_model(b, trust=trust, imports=imports).graph_def
    reference, other, _ = comparable_reference(reference, other, settings)   # seeds, dropout
    names = localize.common_tensors(reference, other)
    names += [tensor_name(o) for o in outputs if tensor_name(o) not in names]
    expected = verify.run_graph(reference, values, names, timeout=timeout, label=str(a))
    actual = verify.run_graph(other, values, names, timeout=timeout, label=str(b))
    ops = {n.name: n.op for n in other.node}
    # the outputs as verification judges them (each part at its own scale, the same dtype)
    parts = scales.parts_in(reference, [tensor_name(o) for o in outputs])
    judged = {tensor_name(o) for o in outputs}
    errors = [scales.judged_error(n, e, x, parts.get(n)) if n in judged else
              verify.output_error(n, e, x) for n, e, x in zip(names, expected, actual)]
    by_name = {e.name: e.max_rel for e in errors}
    graph = Graph(other, check_inputs=False)
    healed = [n for n in names if by_name[n] > tolerance and node_name(n) not in
              {node_name(o) for o in outputs} and
              localize.made_up_for(graph, n, by_name, tolerance)]
    return Comparison(str(a), str(b), errors, {n: ops.get(node_name(n), "?") for n in names},
                      tolerance, "every tensor both have", healed)


def _against_outputs(reference, values, outputs, tolerance, timeout, a, b, actual) -> Comparison:
    expected = verify.run_graph(reference, values, outputs, timeout=timeout, label=str(a))
    parts = scales.parts_in(reference, [tensor_name(o) for o in outputs])
    return Comparison(str(a), str(b), [scales.judged_error(tensor_name(n), e, x,
                                                           parts.get(tensor_name(n)),
                                                           same_dtype=False)
                                       for n, e, x in zip(outputs, expected, actual)], {},
                      tolerance, "the outputs")


def _run_tflite(path: Path, values: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list:
    """The model's default signature, fed and read by the graph's names."""
    from tfsurgery.export.tflite import interpreter_class
    runner = interpreter_class()[0](model_path=str(path)).get_signature_runner()
    wanted = set(runner.get_input_details())
    result = runner(**{node_name(k): v for k, v in values.items() if node_name(k) in wanted})
    missing = [o for o in outputs if node_name(o) not in result]
    if missing:
        raise InputError(f"{path}: its signature has no output '{node_name(missing[0])}' "
                         f"(it has {', '.join(result)})")
    return [result[node_name(o)] for o in outputs]
