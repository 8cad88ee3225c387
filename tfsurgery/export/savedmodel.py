"""Checked SavedModel export: the optimized GraphDef back out as a SavedModel, verified by calling
the loaded signature.

The GraphDef is frozen (constants only), so TensorFlow's v1 ``SavedModelBuilder`` writes it as is,
with a ``SignatureDef`` naming each input and output tensor: names and dtypes are exactly the
graph's (a uint8 input stays uint8). For a SavedModel input the signature key and its input/output
names are the input signature's (``io`` remembers them); for a frozen graph, ``serving_default``
with the graph's own names. The export is then loaded with ``tf.saved_model.load`` and its
signature called on the verification inputs — the path TF Serving, the TFLite converter and users
take — and compared with the GraphDef run in TensorFlow (with preprocessing in the graph: with the
original graph fed the verifier's own NumPy preprocessing). Built in a staging directory next to
the target and renamed into place only if it matched.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

import numpy as np

from tfsurgery import cpu_layout
from tfsurgery.export import artefacts
from tfsurgery.verify import check as verify
from tfsurgery.export.artefacts import Artefact
from tfsurgery.errors import ExportError
from tfsurgery.ops import first_line, tensor_name

DEFAULT_KEY = "serving_default"
SERVE_TAG = "serve"


@dataclasses.dataclass
class Signature:
    """A signature: its key, and signature name → graph tensor for its inputs and outputs."""

    key: str
    inputs: Dict[str, str]
    outputs: Dict[str, str]

    def __post_init__(self):
        self.inputs = {key: tensor_name(n) for key, n in self.inputs.items()}
        self.outputs = {key: tensor_name(n) for key, n in self.outputs.items()}

    @classmethod
    def of_graph(cls, inputs: Sequence[str], outputs: Sequence[str],
                 key: str = DEFAULT_KEY) -> "Signature":
        """The graph's own names (``node``, or ``node_1`` for port 1) for a frozen graph."""
        return cls(key, {_key(n): tensor_name(n) for n in inputs},
                   {_key(n): tensor_name(n) for n in outputs})

    @classmethod
    def kept(cls, given: dict, inputs: Sequence[str], outputs: Sequence[str]) -> "Signature":
        """A SavedModel input's signature (``io``'s dict) for the optimized graph: its key
        always, its names for the tensors it names, the graph's own names for others (chosen
        with --inputs/--outputs)."""
        def names(tensors, known):
            by_tensor = {tensor_name(t): key for key, t in known.items()}
            return {by_tensor.get(tensor_name(n), _key(n)): tensor_name(n) for n in tensors}
        chosen = names(inputs, given["inputs"]), names(outputs, given["outputs"])
        if len(chosen[0]) != len(inputs) or len(chosen[1]) != len(outputs):    # a name clash
            return cls.of_graph(inputs, outputs, key=given["key"])
        return cls(given["key"], *chosen)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _key(name: str) -> str:
    node, _, port = name.partition(":")
    return node if port in ("", "0") else f"{node}_{port}"


def export(graph_def, signature: Signature, path, *, feeds: Mapping[str, np.ndarray],
           tolerance: float, timeout: float = verify.DEFAULT_TIMEOUT, force: bool = False,
           input_path=None, weights: str = "float32",
           expected: Optional[Mapping[str, np.ndarray]] = None,
           batch: Optional[artefacts.Batch] = None) -> Artefact:
    """Write ``graph_def`` as a SavedModel directory at ``path`` if its signature, loaded back,
    matches the reference on ``feeds``: ``expected`` (graph output → values, e.g. the original
    fed the verifier's preprocessing) or else the GraphDef in TensorFlow. With a ``batch`` it is
    published when the whole run has passed. The returned ``Artefact`` says how well."""
    path = Path(path)
    artefacts.check_new_directory(path, force, input_path)
    reference_note = artefacts.OPTIMIZED_REFERENCE if expected is None else \
        artefacts.ORIGINAL_REFERENCE
    expected = reference(graph_def, signature, feeds, timeout, expected)
    with artefacts.staging(path, batch) as stage:
        staged = stage / "saved_model"
        build(graph_def, signature, staged)
        artefact = check(staged, signature, feeds, expected, tolerance=tolerance, timeout=timeout)
        artefact.path, artefact.weights, artefact.reference = path, weights, reference_note
        if artefact.passed:
            artefacts.publish(lambda: artefacts.publish_directory(staged, path, stage), batch,
                              stage)
    return artefact


def reference(graph_def, signature: Signature, feeds, timeout: float,
              expected: Optional[Mapping[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
    """The reference outputs keyed by signature output name: ``expected`` (keyed by graph
    output) where given, else the optimized GraphDef's outputs in TensorFlow."""
    keys = list(signature.outputs)
    if expected is not None:
        given = {tensor_name(k): v for k, v in expected.items()}
        return {key: given[signature.outputs[key]] for key in keys}
    try:
        values = verify.run_graph(graph_def, feeds, [signature.outputs[k] for k in keys],
                                  timeout=timeout, label="the optimized graph")
    except verify.VerificationError as error:
        raise ExportError(f"no TensorFlow reference to compare with: {error}") from None
    return dict(zip(keys, values))


def build(graph_def, signature: Signature, directory: Path) -> None:
    """Write a frozen GraphDef as a SavedModel at ``directory`` (which must not exist)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        v1.import_graph_def(graph_def, name="")

        def info(names: Mapping[str, str]):
            return {key: v1.saved_model.build_tensor_info(graph.get_tensor_by_name(name))
                    for key, name in names.items()}
        definition = v1.saved_model.build_signature_def(
            info(signature.inputs), info(signature.outputs),
            v1.saved_model.signature_constants.PREDICT_METHOD_NAME)
        with v1.Session(graph=graph) as session:
            builder = v1.saved_model.Builder(str(directory))
            builder.add_meta_graph_and_variables(session, [SERVE_TAG], strip_default_attrs=True,
                                                 signature_def_map={signature.key: definition})
            builder.save()
    # TF2's tf.saved_model.save writes a fingerprint; the v1 builder does not, and loaders
    # complain ("Fingerprint not found") without one.
    from tensorflow.python.saved_model import fingerprinting_utils
    fingerprinting_utils.write_fingerprint(str(directory))


def check(directory: Path, signature: Signature, feeds: Mapping[str, np.ndarray],
          expected: Mapping[str, np.ndarray], *, tolerance: float,
          timeout: float = verify.DEFAULT_TIMEOUT) -> Artefact:
    """Load the SavedModel with ``tf.saved_model.load``, call its signature on ``feeds``, compare."""
    actual = artefacts.with_deadline(lambda: run(directory, signature, feeds), timeout,
                                     "the SavedModel's signature")
    errors, max_error, compared = artefacts.compare(expected, actual)
    return Artefact("saved_model", directory, artefacts.size_of(directory), max_error, tolerance,
                    compared and max_error <= tolerance, "tf.saved_model.load signature",
                    outputs=errors)


def run(directory: Path, signature: Signature,
        feeds: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    import tensorflow as tf
    if not cpu_layout.channels_first_runs():
        return _run_saved_graph(directory, signature, feeds)
    try:
        loaded = tf.saved_model.load(str(directory))
        function = loaded.signatures[signature.key]
        outputs = function(**{key: tf.constant(value) for key, value in
                              artefacts.feeds_by_key(feeds, signature.inputs).items()})
    except Exception as error:  # noqa: BLE001 - TF raises many types here
        raise ExportError(f"the SavedModel does not load and run: {first_line(error)}") from None
    return {key: value.numpy() for key, value in outputs.items()}


def _run_saved_graph(directory: Path, signature: Signature,
                     feeds: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Where this CPU cannot run NCHW ops as written (no oneDNN): the SavedModel's own graph and
    signature, read back from disk, run in a session with those ops through transposes
    (``cpu_layout``), as the verification ran the .pb."""
    from tensorflow.python.saved_model import loader_impl
    try:
        meta_graph = loader_impl.parse_saved_model(str(directory)).meta_graphs[0]
        definition = meta_graph.signature_def[signature.key]
    except Exception as error:  # noqa: BLE001 - TF raises many types here
        raise ExportError(f"the SavedModel does not load: {first_line(error)}") from None
    by_key = artefacts.feeds_by_key(feeds, signature.inputs)
    keys = list(definition.outputs)
    try:
        values = verify.run_graph(meta_graph.graph_def,
                                  {definition.inputs[k].name: v for k, v in by_key.items()},
                                  [definition.outputs[k].name for k in keys],
                                  label="the SavedModel's graph")
    except verify.VerificationError as error:
        raise ExportError(f"the SavedModel does not run: {error}") from None
    return dict(zip(keys, values))


def check_target(path, force: bool, input_path=None) -> None:
    """Before minutes of work: the SavedModel directory can be written."""
    artefacts.check_new_directory(Path(path), force, input_path)
