"""Checked OpenVINO export: OpenVINO's own converter, then OpenVINO's CPU runtime.

The optimized (frozen) GraphDef goes to ``openvino.convert_model`` as is — OpenVINO's TensorFlow
frontend, graph outputs named so nothing else is kept — and is saved as IR (``model.xml`` +
``model.bin``) with ``openvino.save_model``, float32 weights (``compress_to_fp16=False``: the
default would round every weight to float16 without saying so). The saved IR is read back,
compiled for the CPU at one inference precision and run on the verification inputs, and its
outputs are compared with the graph in TensorFlow. The directory is published (renamed into
place) only if they match.

Precision is a property of the *compiled* model, not of the IR: OpenVINO's CPU plugin runs
bfloat16 by default on CPUs with native bf16 (AVX512_BF16, AMX), and silently turns an f16
request into bf16 on CPUs without native float16. So the check compiles with
``INFERENCE_PRECISION_HINT`` set explicitly, confirms the compiled model kept it, and records it
in the IR's ``rt_info`` (``tfsurgery/inference_precision``), where the deploying code can read
which precision the IR was checked at. Each precision has its own tolerance (``TOLERANCES``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from tfsurgery.export import artefacts
from tfsurgery.trust import outside
from tfsurgery.verify import check as verify
from tfsurgery.export.artefacts import Artefact
from tfsurgery.errors import ExportError, InputError
from tfsurgery.ops import first_line, node_name, tensor_name

INSTALL_HINT = ("OpenVINO is not installed: pip install 'tfsurgery[openvino]' "
                "(or pip install openvino)")
XML = "model.xml"
PRECISIONS = ("f32", "bf16", "f16")
# Relative to each output's magnitude, as every check measures it.
# f32: OpenVINO's own CPU kernels (other accumulation orders, fused ops) differ from TensorFlow's
# by ~3e-4 on MobileNetV2 — beyond the default 1e-4, so f32 gets 1e-3.
# bf16: 8 significant bits, each rounding up to 2^-9 ≈ 2e-3 of a value; on deep nets the outputs
# move by a few percent of their magnitude (measured: see docs/openvino.md): 5e-2.
# f16: 11 significant bits, as --store-weights float16 (and its 1e-2) but on activations too: 2e-2.
TOLERANCES = {"f32": 1e-3, "bf16": 5e-2, "f16": 2e-2}
CAPABILITY = {"f32": "FP32", "bf16": "BF16", "f16": "FP16"}
OV_TYPE_NAMES = {"float32": "f32", "f32": "f32", "bfloat16": "bf16", "bf16": "bf16",
                 "float16": "f16", "f16": "f16"}
DEVICE = "CPU"


def require() -> None:
    """OpenVINO importable, or one line saying how to get it (``InputError``: exit 2)."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        raise InputError(INSTALL_HINT) from None


def installed() -> bool:
    try:
        require()
    except InputError:
        return False
    return True


def _core():
    import openvino as ov
    return ov.Core()


def cpu_name() -> str:
    return str(_core().get_property(DEVICE, "FULL_DEVICE_NAME"))


def supported_precisions() -> List[str]:
    """The inference precisions this CPU runs natively, as OpenVINO reports them."""
    capabilities = set(_core().get_property(DEVICE, "OPTIMIZATION_CAPABILITIES"))
    return [p for p in PRECISIONS if CAPABILITY[p] in capabilities]


def default_precision() -> str:
    """What OpenVINO's CPU plugin runs when nobody says: bf16 where the CPU has it."""
    return precision_name(_core().get_property(DEVICE, "INFERENCE_PRECISION_HINT"))


def precision_name(ov_type) -> str:
    name = ov_type.get_type_name() if hasattr(ov_type, "get_type_name") else str(ov_type)
    return OV_TYPE_NAMES.get(name, name)


def check_precision(precision: str) -> None:
    """Before any work: a known precision this CPU runs natively, else one line (exit 2)."""
    if precision not in PRECISIONS:
        raise InputError(f"--openvino-precision {precision}: choose from {', '.join(PRECISIONS)}")
    require()
    if precision not in supported_precisions():
        raise InputError(f"--openvino-precision {precision}: this CPU ({cpu_name()}) has no native "
                         f"{precision} (OpenVINO would run another format); it runs "
                         f"{', '.join(supported_precisions())}")


def tolerance_for(precision: str, run_tolerance: float) -> float:
    """The check's tolerance at ``precision``: its own, or the run's if that is looser."""
    return max(TOLERANCES[precision], run_tolerance)


def check_target(path, force: bool, input_path=None) -> None:
    """Before minutes of work: OpenVINO installed, and the IR directory can be written."""
    require()
    artefacts.check_new_directory(Path(path), force, input_path)


def export(graph_def, inputs: Sequence[str], outputs: Sequence[str], path, *,
           feeds: Mapping[str, np.ndarray], precision: str = "f32",
           tolerance: Optional[float] = None, timeout: float = verify.DEFAULT_TIMEOUT,
           force: bool = False, input_path=None, weights: str = "float32",
           expected: Optional[Mapping[str, np.ndarray]] = None,
           batch: Optional[artefacts.Batch] = None) -> Artefact:
    """Convert ``graph_def`` to OpenVINO IR in the directory ``path`` (``model.xml``/``.bin``);
    published (with a ``batch``: when the whole run has passed) only if OpenVINO, compiled at
    ``precision``, matches the reference on ``feeds`` within ``tolerance`` (default: the
    precision's own): ``expected`` (graph output → values) where given, else the GraphDef in
    TensorFlow."""
    check_precision(precision)
    path = Path(path)
    artefacts.check_new_directory(path, force, input_path)
    tolerance = TOLERANCES[precision] if tolerance is None else tolerance
    reference_note = artefacts.OPTIMIZED_REFERENCE if expected is None else \
        artefacts.ORIGINAL_REFERENCE
    expected = reference(graph_def, outputs, feeds, timeout, expected)
    with artefacts.staging(path, batch) as stage:
        staged = stage / "openvino"
        save(convert(graph_def, inputs, outputs), staged, precision)
        artefact = check(staged, outputs, feeds, expected, precision=precision,
                         tolerance=tolerance, timeout=timeout)
        artefact.path, artefact.weights, artefact.reference = path, weights, reference_note
        if artefact.passed:
            artefacts.publish(lambda: artefacts.publish_directory(staged, path, stage), batch,
                              stage)
    return artefact


def reference(graph_def, outputs: Sequence[str], feeds, timeout: float,
              expected: Optional[Mapping[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
    """The reference outputs keyed by graph tensor (``name:0``)."""
    if expected is not None:
        given = {tensor_name(k): np.asarray(v) for k, v in expected.items()}
        return {tensor_name(o): given[tensor_name(o)] for o in outputs}
    try:
        values = verify.run_graph(graph_def, dict(feeds), list(outputs), timeout=timeout,
                                  label="the optimized graph")
    except verify.VerificationError as error:
        raise ExportError(f"no TensorFlow reference to compare with: {error}") from None
    return {tensor_name(o): v for o, v in zip(outputs, values)}


def convert(graph_def, inputs: Sequence[str], outputs: Sequence[str]):
    """The ov.Model of a frozen GraphDef (OpenVINO's TensorFlow frontend)."""
    import openvino as ov
    outside.refuse_conversion(graph_def, "OpenVINO export")
    try:
        return ov.convert_model(graph_def, input=[tensor_name(i) for i in inputs],
                                output=[tensor_name(o) for o in outputs])
    except Exception as error:  # noqa: BLE001 - OpConversionFailure, RuntimeError, ...
        raise ExportError(f"OpenVINO's converter refuses the graph: {first_line(error)}") \
            from None


def save(model, directory: Path, precision: str = "f32") -> Path:
    """``model.xml``/``model.bin`` in ``directory``: float32 weights (float16 for f16), and the
    precision it is checked at in its rt_info."""
    import openvino as ov
    directory.mkdir(parents=True)
    model.set_rt_info(precision, ["tfsurgery", "inference_precision"])
    xml = directory / XML
    ov.save_model(model, str(xml), compress_to_fp16=precision == "f16")
    return xml


def compile_ir(xml: Path, precision: Optional[str], threads: Optional[int] = None):
    """The IR compiled for the CPU at ``precision`` (None: OpenVINO's default) with the latency
    hint — how a single request is served; ``threads``: its inference threads."""
    config = {"PERFORMANCE_HINT": "LATENCY"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    core = _core()
    compiled = core.compile_model(core.read_model(str(xml)), DEVICE, config)
    got = precision_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
    if precision is not None and got != precision:       # f16 → bf16, say, on some CPUs
        raise ExportError(f"OpenVINO compiled the model at {got}, not the {precision} asked for")
    return compiled


def fed_ports(ports, feeds: Mapping[str, np.ndarray], missing: str) -> list:
    """(port, value) for each input port, its value found in ``feeds`` by the TensorFlow tensor
    or node name the port carries; a port nothing feeds: ``ExportError(missing.format(name))``."""
    pairs = []
    for port in ports:
        names = port.get_names()
        key = next((k for k in feeds if tensor_name(k) in names or node_name(k) in names), None)
        if key is None:
            raise ExportError(missing.format(port.get_any_name()))
        pairs.append((port, np.ascontiguousarray(feeds[key])))
    return pairs


def runner(compiled, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]):
    """A no-argument function running one inference on ``feeds``, returning the outputs in
    ``outputs`` order. Ports are found by their TensorFlow tensor names."""
    request = compiled.create_infer_request()
    given = dict(fed_ports(compiled.inputs, feeds, "the OpenVINO model's input {} is not fed"))
    ports = [_output_port(compiled, o) for o in outputs]

    def run() -> List[np.ndarray]:
        request.infer(given)
        return [np.array(request.get_tensor(port).data) for port in ports]
    return run


def _output_port(compiled, output: str):
    for port in compiled.outputs:
        if tensor_name(output) in port.get_names() or node_name(output) in port.get_names():
            return port
    raise ExportError(f"the OpenVINO model has no output {tensor_name(output)}")


def run(xml: Path, feeds: Mapping[str, np.ndarray], outputs: Sequence[str],
        precision: Optional[str]) -> Dict[str, np.ndarray]:
    """The IR's outputs (graph tensor → values) on ``feeds``, compiled at ``precision``."""
    try:
        values = runner(compile_ir(xml, precision), feeds, outputs)()
    except ExportError:
        raise
    except Exception as error:  # noqa: BLE001 - OpenVINO raises RuntimeError and kin
        raise ExportError(f"OpenVINO cannot run the model: {first_line(error)}") from None
    return {tensor_name(o): v for o, v in zip(outputs, values)}


def check(directory: Path, outputs: Sequence[str], feeds: Mapping[str, np.ndarray],
          expected: Mapping[str, np.ndarray], *, precision: str, tolerance: float,
          timeout: float = verify.DEFAULT_TIMEOUT) -> Artefact:
    """Read the IR back, compile it at ``precision``, run it on ``feeds``, compare."""
    actual = artefacts.with_deadline(lambda: run(directory / XML, feeds, outputs, precision),
                                     timeout, f"the OpenVINO model at {precision}")
    errors, max_error, compared = artefacts.compare(expected, actual)
    return Artefact("openvino", directory, artefacts.size_of(directory), max_error, tolerance,
                    compared and max_error <= tolerance,
                    f"OpenVINO {DEVICE}, inference precision {precision}", outputs=errors)
