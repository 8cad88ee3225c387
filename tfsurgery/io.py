"""Reading and writing graphs.

Every failure a user can cause (missing file, corrupt protobuf, a graph with variables, ...) raises
``InputError`` with a one-line message; the CLI turns it into exit status 2. Outputs are written to a
temporary file in the target directory and renamed into place, so a crash never leaves half a file,
and an output path equal to the input path is refused.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from pathlib import Path
from typing import List, Sequence

from google.protobuf import message, text_format
from tensorflow.core.framework import graph_pb2

from tfsurgery.trust import keras as keras_trust
from tfsurgery.trust import outside
from tfsurgery.errors import GraphError, InputError
from tfsurgery.graph import check_structure
from tfsurgery.ops import (CONTROL_FLOW_V1_OPS, FUNCTIONAL_CONTROL_FLOW_OPS, VARIABLE_OPS,
                           first_line, node_name)

TEXT_SUFFIXES = (".pbtxt", ".txt", ".prototxt")


log = logging.getLogger("tfsurgery")


KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


@dataclasses.dataclass
class Loaded:
    """A frozen GraphDef and the interface its source declared (empty: detect)."""

    graph_def: graph_pb2.GraphDef
    inputs: List[str] = dataclasses.field(default_factory=list)
    outputs: List[str] = dataclasses.field(default_factory=list)
    frozen_form: str = ""          # how a SavedModel/Keras model was frozen (for the report)
    # a SavedModel's signature: {"key": ..., "inputs"/"outputs": {signature name: graph tensor}}
    signature: dict = dataclasses.field(default_factory=dict)
    # what the user trusted (--trust-model) and whose code was imported (--import), for the report
    trust_notes: List[str] = dataclasses.field(default_factory=list)


def load_model(path, signature: str = "serving_default", *, trust: bool = False,
               imports: Sequence[str] = ()) -> Loaded:
    """Any supported input: a frozen .pb/.pbtxt, a SavedModel directory, a .keras/.h5 file.
    ``imports``: modules (names or .py paths) imported first, the user's own code a Keras
    model needs; ``trust``: load a Keras file that holds Python code (a Lambda's bytecode)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    modules = keras_trust.import_modules(imports)
    notes = [keras_trust.import_note(spec, module, len(keras_trust.custom_objects([module])))
             for spec, module in zip(imports, modules)]
    loaded = _load_model(path, signature, trust, keras_trust.custom_objects(modules))
    loaded.trust_notes = notes + loaded.trust_notes
    return loaded


def _load_model(path: Path, signature: str, trust: bool, custom_objects: dict) -> Loaded:
    if path.is_dir():
        if not (path / "saved_model.pb").exists() and not (path / "saved_model.pbtxt").exists():
            raise InputError(f"{path}: is a directory but not a SavedModel (no saved_model.pb)")
        return load_saved_model(path, signature)
    if path.suffix.lower() in KERAS_SUFFIXES:
        return load_keras(path, trust=trust, custom_objects=custom_objects)
    graph_def = load_graph_def(path)
    return Loaded(graph_def, frozen_form=f"as given (a frozen GraphDef; "
                                         f"{control_flow_form(graph_def)})")


def load_saved_model(path: Path, signature: str = "serving_default") -> Loaded:
    import tensorflow as tf
    log.info("loading and freezing the SavedModel %s", path)
    check_saved_model(path)
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as error:  # noqa: BLE001 - TF raises many types for a broken SavedModel
        raise InputError(f"{path}: cannot load the SavedModel ({first_line(error)})") from None
    signatures = dict(getattr(loaded, "signatures", {}))
    if signature not in signatures:
        known = ", ".join(sorted(signatures)) or "none"
        raise InputError(f"{path}: no signature '{signature}' (available: {known}); "
                         "choose one with --signature")
    loaded_model = freeze_concrete_function(signatures[signature], str(path))
    loaded_model.signature = signature_names(signatures[signature], signature, loaded_model)
    return loaded_model


def check_saved_model(path: Path) -> None:
    """Before TensorFlow loads it (loading runs its table initializers and restores its
    variables): everything the SavedModel holds may run (tfsurgery.trust.outside: its own
    checkpoint ops and tables filled from its own assets proven) — ``UnsafeModel`` otherwise."""
    outside.refuse_findings(outside.find_in_saved_model(read_saved_model(path), path), str(path))


def read_saved_model(path: Path):
    """The ``SavedModel`` proto of a SavedModel directory, parsed without loading anything."""
    from tensorflow.core.protobuf import saved_model_pb2
    saved_model = saved_model_pb2.SavedModel()
    binary = path / "saved_model.pb"
    try:
        if binary.exists():
            saved_model.ParseFromString(binary.read_bytes())
        else:
            text_format.Parse((path / "saved_model.pbtxt").read_text(), saved_model)
    except (OSError, message.DecodeError, text_format.ParseError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a valid SavedModel ({first_line(error)})") from None
    return saved_model


def signature_names(function, key: str, loaded: Loaded) -> dict:
    """The signature's structured input/output names → the frozen graph's tensors. A signature
    function takes its inputs as keyword arguments and returns a dict; both flatten in sorted key
    order, the order of ``function.inputs`` / ``function.outputs``."""
    inputs = sorted(function.structured_input_signature[1])
    outputs = function.structured_outputs
    if not isinstance(outputs, dict) or len(inputs) > len(loaded.inputs) or \
            len(outputs) != len(loaded.outputs):
        return {}
    return {"key": key, "inputs": dict(zip(inputs, loaded.inputs)),
            "outputs": dict(zip(sorted(outputs), loaded.outputs))}


def load_keras(path: Path, *, trust: bool = False, custom_objects=None) -> Loaded:
    """A Keras 3 ``.keras``/``.h5`` file (legacy Keras 2 ``.h5`` through tf_keras). Its config
    is read first, without deserializing anything: stored Python code is refused unless
    ``trust``, and classes nothing provides are named (``--import``) before either loader runs —
    tf_keras, the fallback, would run a Lambda's bytecode and import any module a config names."""
    import tensorflow as tf
    custom_objects = dict(custom_objects or {})
    config = keras_trust.read_config(path)
    notes = []
    if trust:
        findings = keras_trust.unsafe_findings(config) if config is not None else []
        notes.append(f"--trust-model: {path.name} loaded without Keras' safe mode" + (
            f" ({'; '.join(f.line() for f in findings)})" if findings else
            " (it held no stored Python code)"))
    else:
        keras_trust.refuse_unsafe(path, config)
        keras_trust.refuse_missing(path, config, custom_objects)
    log.info("loading and freezing the Keras model %s", path)
    try:
        model = tf.keras.models.load_model(str(path), compile=False, safe_mode=not trust,
                                           custom_objects=custom_objects or None)
    except Exception as keras3_error:  # noqa: BLE001
        keras_trust.refuse_fallback(path, keras3_error)     # tf_keras only for legacy files
        try:
            import tf_keras
            model = tf_keras.models.load_model(str(path), compile=False, safe_mode=not trust,
                                               custom_objects=custom_objects or None)
        except Exception:  # noqa: BLE001 - report the Keras 3 error, the primary loader's
            keras_trust.refuse_missing(path, config, custom_objects, legacy_layers=True)
            raise InputError(f"{path}: cannot load the Keras model "
                             f"({first_line(keras3_error)})") from None
    loaded = freeze_concrete_function(_keras_call(model, path), str(path))
    loaded.trust_notes = notes
    return loaded


def _keras_call(model, path: Path):
    """The model called in inference mode with the input structure it was built with (a
    tensor, a one-element list, a dict of named inputs as keras-hub backbones take, nested),
    each input a placeholder named as the Keras input. Any failure: one line, no traceback."""
    import tensorflow as tf
    structure = getattr(model, "_inputs_struct", None)       # Keras 3 Functional, as built
    if structure is None:
        structure = getattr(model, "_nested_inputs", None)   # tf_keras Functional
    try:
        if structure is None:
            structure = model.inputs if len(model.inputs) > 1 else model.inputs[0]
        specs = tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, t.dtype, name=_plain_name(t)), structure)
        function = tf.function(lambda inputs: model(inputs, training=False))
        return function.get_concrete_function(specs)
    except Exception as error:  # noqa: BLE001 - Keras raises many types for a call it refuses
        raise InputError(f"{path}: cannot call the Keras model on its own inputs "
                         f"({first_line(error)})") from None


def freeze_concrete_function(function, where: str) -> Loaded:
    """Variables → constants, keeping functional control flow (While/If stay, with their bodies
    in the function library) and the real input and output names — as tf2onnx's own loader
    freezes, so tf2onnx later sees the While it turns into an ONNX Loop. Recurrent layers whose
    dropout seed state is assigned at inference (Keras 3 LSTM/GRU) defeat TF's freezer; then
    tf2onnx's own repair is used: freeze without the check and drop the variable assignments."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import \
        convert_variables_to_constants_v2
    # A function's inputs end with its captures (variables, and constant tensors a tf.Module
    # holds): the freeze makes those constants; only the others are fed (as tf2onnx's loader).
    captured = {t.ref() for t in function.graph.internal_captures}
    inputs = [t.op.name for t in function.inputs
              if t.dtype != tf.resource and t.ref() not in captured]
    outputs = [t.op.name for t in function.outputs]
    try:
        frozen = convert_variables_to_constants_v2(function, lower_control_flow=False,
                                                   aggressive_inlining=True)
        graph_def = frozen.graph.as_graph_def()
        how = "frozen without lowering (convert_variables_to_constants_v2)"
    except ValueError as error:
        if "incompatible with expected resource" not in str(error):
            raise InputError(f"{where}: cannot freeze the model ({first_line(error)})") from None
        from tf2onnx import tf_loader
        graph_def = tf_loader.fix_freezing_errors(
            tf_loader.convert_variables_to_constants_large_model(function))
        how = ("frozen without lowering by tf2onnx's repair (fix_freezing_errors: the "
               "variable assignments TF's freezer rejects dropped)")
    except Exception as error:  # noqa: BLE001
        raise InputError(f"{where}: cannot freeze the model ({first_line(error)})") from None
    tables = embed_tables(graph_def, function)
    if tables:
        how += f"; {tables} lookup table(s) kept in the graph with their keys and values"
    check_graph_def(graph_def, where)
    return Loaded(graph_def, inputs, outputs,
                  frozen_form=f"{how}; {control_flow_form(graph_def)}")


TABLE_READER_OPS = frozenset({"LookupTableFindV2", "LookupTableSizeV2", "LookupTableExportV2"})


def embed_tables(graph_def: graph_pb2.GraphDef, function) -> int:
    """A lookup table the function captures (a StringLookup's, TextVectorization's vocabulary)
    stays a resource placeholder after freezing: the graph cannot run without it. Each becomes
    a ``HashTableV2`` filled from constants of its own keys and values (read from the live
    table with ``LookupTableExportV2``) by a ``LookupTableImportV2`` every reader waits for —
    the vocabulary is in the graph, the graph runs on its own. Returns how many."""
    import tensorflow as tf
    nodes = {node.name: node for node in graph_def.node}
    variables = {id(v.handle) for v in function.graph.variables}
    embedded = 0
    for external, internal in function.graph.captures:
        name = internal.op.name
        if external.dtype != tf.resource or id(external) in variables or \
                nodes.get(name) is None or nodes[name].op != "Placeholder":
            continue
        readers = _table_readers(graph_def, name)
        if not readers:
            continue
        key_type, value_type = readers[0].attr["Tin"].type, readers[0].attr["Tout"].type
        try:
            keys, values = tf.raw_ops.LookupTableExportV2(
                table_handle=external, Tkeys=tf.dtypes.as_dtype(key_type),
                Tvalues=tf.dtypes.as_dtype(value_type))
        except Exception:  # noqa: BLE001 - not a table we can read: left as it was
            continue
        _table_nodes(nodes[name], key_type, value_type)
        init = _table_import(graph_def, name, keys.numpy(), values.numpy())
        for reader in readers:
            reader.input.append(f"^{init}")
        _drop_ordering_edges(graph_def, {reader.name for reader in readers})
        embedded += 1
    return embedded


def _drop_ordering_edges(graph_def, lookups) -> None:
    """The function's automatic control dependencies (a NoOp the outputs wait for) order the
    lookups like stateful ops; with the table constant a lookup is a pure function, and the
    edge would make a cut after it (``--inputs`` the token ids) still need the strings."""
    for node in graph_def.node:
        if node.op == "NoOp":
            kept = [ref for ref in node.input if ref[1:] not in lookups or ref[0] != "^"]
            if len(kept) != len(node.input):
                del node.input[:]
                node.input.extend(kept)


def _table_readers(graph_def, table: str) -> list:
    """The lookups that read table handle ``table`` (through Identity forwarding)."""
    handles, readers, changed = {table}, [], True
    while changed:
        changed = False
        for node in graph_def.node:
            if node.name not in handles and node.op == "Identity" and node.input and \
                    node_name(node.input[0]) in handles:
                handles.add(node.name)
                changed = True
    for node in graph_def.node:
        if node.op in TABLE_READER_OPS and node.input and node_name(node.input[0]) in handles:
            readers.append(node)
    return [r for r in readers if r.op == "LookupTableFindV2"] or []


def _table_nodes(placeholder, key_type, value_type) -> None:
    """The placeholder becomes the table itself."""
    name = placeholder.name
    placeholder.Clear()
    placeholder.name, placeholder.op = name, "HashTableV2"
    placeholder.attr["key_dtype"].type = key_type
    placeholder.attr["value_dtype"].type = value_type
    placeholder.attr["shared_name"].s = f"tfsurgery_table_{name}".encode()
    placeholder.attr["container"].s = b""
    placeholder.attr["use_node_name_sharing"].b = False


def _table_import(graph_def, table: str, keys, values) -> str:
    import tensorflow as tf
    for suffix, array in (("keys", keys), ("values", values)):
        const = graph_def.node.add(name=f"{table}/embedded_{suffix}", op="Const")
        proto = tf.make_tensor_proto(array)
        const.attr["value"].tensor.CopyFrom(proto)
        const.attr["dtype"].type = proto.dtype
    init = graph_def.node.add(name=f"{table}/embedded_import", op="LookupTableImportV2",
                              input=[table, f"{table}/embedded_keys",
                                     f"{table}/embedded_values"])
    init.attr["Tin"].type = tf.make_tensor_proto(keys).dtype
    init.attr["Tout"].type = tf.make_tensor_proto(values).dtype
    return init.name


FUNCTIONAL_CONTROL_FLOW = FUNCTIONAL_CONTROL_FLOW_OPS      # the one set, in tfsurgery.ops


def control_flow_form(graph_def: graph_pb2.GraphDef) -> str:
    """Which form the graph's control flow is in: functional (While/If with bodies in the
    function library, which tf2onnx turns into ONNX Loop/If) or v1 (Switch/Merge,
    Enter/Exit loops: TF1 graphs, or TF2 graphs frozen with lowering)."""
    ops = {node.op for node in graph_def.node}
    ops |= {node.op for function in graph_def.library.function for node in function.node_def}
    forms = []
    functional = sorted(ops & FUNCTIONAL_CONTROL_FLOW)
    if functional:
        forms.append(f"functional control flow: {', '.join(functional)}")
    if ops & CONTROL_FLOW_V1_OPS:
        loops = "Enter/Exit loops" if "Enter" in ops else "no loops"
        forms.append(f"v1 control flow: Switch/Merge, {loops}")
    return "; ".join(forms) or "no control flow"


def _plain_name(tensor) -> str:
    name = getattr(tensor, "name", None) or "input"
    return name.split(":")[0].replace("/", "_")


def load_graph_def(path) -> graph_pb2.GraphDef:
    """A GraphDef from a binary ``.pb`` or text ``.pbtxt`` file, checked for basic sanity."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a .pb/.pbtxt file")
    check_protobuf_size(path.stat().st_size, str(path))      # parsing would just fail
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror})") from None
    if not data:
        raise InputError(f"{path}: file is empty")
    graph_def = graph_pb2.GraphDef()
    try:
        if path.suffix.lower() in TEXT_SUFFIXES:
            text_format.Parse(data.decode("utf-8"), graph_def)
        else:
            graph_def.ParseFromString(data)
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError, ValueError) as error:
        kind = "text" if path.suffix.lower() in TEXT_SUFFIXES else "binary"
        raise InputError(f"{path}: not a valid {kind} GraphDef ({first_line(error)})") from None
    check_graph_def(graph_def, str(path))
    return graph_def


PROTOBUF_LIMIT = 2 ** 31          # one protobuf message cannot be larger


def check_protobuf_size(size: int, where: str) -> None:
    """A frozen GraphDef over 2 GB cannot exist as one protobuf message: say what to do instead."""
    if size >= PROTOBUF_LIMIT:
        raise InputError(
            f"{where} is {size / 2 ** 30:.1f} GiB, beyond protobuf's 2 GiB limit for a frozen "
            "GraphDef; pass the SavedModel directory instead (or convert it directly: "
            "python -m tf2onnx.convert --saved-model DIR --large_model --output OUT.onnx)")


def check_graph_def(graph_def: graph_pb2.GraphDef, where: str = "graph") -> None:
    if not graph_def.node:
        raise InputError(f"{where}: the graph has no nodes (is this a GraphDef?)")
    if any(not node.op for node in graph_def.node):
        raise InputError(f"{where}: not a valid GraphDef (a node has no op)")
    variables = [n.name for n in graph_def.node if n.op in VARIABLE_OPS]
    if variables:
        raise InputError(
            f"{where}: the graph still holds variables (e.g. '{variables[0]}'); freeze it first "
            "(tf.compat.v1.graph_util.convert_variables_to_constants) or pass the SavedModel "
            "directory instead")
    check_assignments(graph_def, where)
    try:
        check_structure(graph_def)
    except GraphError as error:
        raise InputError(f"{where}: {error}") from None
    check_constants(graph_def, where)


ASSIGN_OPS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})


def check_assignments(graph_def: graph_pb2.GraphDef, where: str) -> None:
    """A variable assignment whose variable the freezer turned into a constant (TF2's
    convert_variables_to_constants_v2 on a Keras 3 LSTM/GRU with dropout, which updates its seed
    state at inference, before its own check rejects the result): TensorFlow cannot import it,
    and neither can tf2onnx. Say so in one line instead of failing on test inputs."""
    ops = {node.name: node.op for node in graph_def.node}
    for node in graph_def.node:
        if node.op in ASSIGN_OPS and node.input and \
                ops.get(node_name(node.input[0])) == "Const":
            raise InputError(
                f"{where}: {node.op} '{node.name}' assigns to a variable the freezer turned "
                "into a constant, so TensorFlow cannot import the graph (Keras 3 LSTM/GRU "
                "dropout state); freeze again dropping the assignments (tf2onnx's "
                "tf_loader.fix_freezing_errors) or pass the SavedModel or Keras file")


def check_constants(graph_def: graph_pb2.GraphDef, where: str) -> None:
    """Every Const holds a tensor TensorFlow can decode (a bad dtype or a shape that disagrees
    with the data would otherwise surface as a crash deep inside a transform)."""
    import tensorflow as tf
    for node in graph_def.node:
        if node.op != "Const":
            continue
        try:
            tf.make_ndarray(node.attr["value"].tensor)
        except Exception as error:  # noqa: BLE001 - TypeError, ValueError, ... all mean "corrupt"
            raise InputError(f"{where}: Const '{node.name}' holds an invalid tensor "
                             f"({first_line(error)})") from None


def save_graph_def(graph_def: graph_pb2.GraphDef, path, *, input_path=None) -> Path:
    """Write atomically (temp file + rename); text format for .pbtxt."""
    path = Path(path)
    refuse_input(path, input_path)
    if graph_def.ByteSize() >= PROTOBUF_LIMIT:      # it would serialize, but never parse again
        raise InputError(f"{path}: the optimized graph is {graph_def.ByteSize() / 2 ** 30:.1f} "
                         "GiB, beyond protobuf's 2 GiB limit; it cannot be saved as one GraphDef")
    if path.suffix.lower() in TEXT_SUFFIXES:
        data = text_format.MessageToString(graph_def).encode()
    else:
        data = graph_def.SerializeToString(deterministic=True)
    write_atomically(path, data)
    return path


def output_directory(path) -> Path:
    """The directory ``path`` goes into; one that does not exist is bad input (the one check
    every writer — file, staged directory, ONNX — makes)."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{path}: output directory {directory} does not exist")
    return directory


def check_writable(path) -> None:
    """Fail early (before minutes of work) if ``path`` cannot be written as a file."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: cannot write (is a directory; for a SavedModel write "
                         f"-o {path}/ or --saved-model {path})")
    directory = output_directory(path)
    if not os.access(directory, os.W_OK):
        raise InputError(f"{path}: cannot write (directory not writable)")


def write_atomically(path: Path, data: bytes) -> None:
    directory = output_directory(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as error:
        raise InputError(f"{path}: cannot write ({error.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_umask())           # mkstemp's 0600 is not what users expect
        os.replace(tmp, path)
    except OSError as error:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write ({error.strerror})") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def refuse_input(path, input_path) -> None:
    """No output may overwrite the input the user gave (one check for every writer)."""
    if input_path is not None and _same_file(Path(path), Path(input_path)):
        raise InputError(f"{path}: refusing to overwrite the input; choose another output")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()
