"""What a Keras file would run when loaded, read from its config without deserializing anything
(issue 35), and the user's own code that loading may use.

A ``.h5``/``.hdf5`` file holds its model config as JSON in the ``model_config`` attribute, a
``.keras`` file in ``config.json`` inside the zip. Walking it finds what Keras 3's ``safe_mode``
refuses (serialization_lib / the Lambda layer): stored Python code (``__lambda__`` objects, tf_keras
``Lambda`` layers with ``function_type: lambda``) and the non-modeling APIs; and, closing the hole
Keras 3's safe mode leaves to the tf_keras fallback (whose ``_retrieve_class_or_fn`` imports any
module a config names), class references to modules outside Keras that nothing registered. Code
the user names (``--import``) is trusted: imported first, its classes registered or offered as
``custom_objects``.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import zipfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from tfsurgery.errors import InputError, UnsafeModel
from tfsurgery.ops import first_line
from tfsurgery.trust.user_code import import_user_code

# The packages Keras 3's safe mode imports a config's classes from (serialization_lib).
KERAS_PACKAGES = frozenset({"keras", "tf_keras", "keras_hub", "keras_cv", "keras_nlp",
                            "builtins"})
# keras.src.saving.serialization_lib.NON_MODELING_APIS (3.15), for when it cannot be imported.
NON_MODELING_APIS = frozenset({
    "keras.backend.clear_session", "keras.config.enable_unsafe_deserialization",
    "keras.models.load_model", "keras.models.model_from_json", "keras.models.save_model",
    "keras.preprocessing.image_dataset_from_directory", "keras.preprocessing.image.load_img",
    "keras.preprocessing.image.save_img", "keras.preprocessing.text_dataset_from_directory",
    "keras.saving.deserialize_keras_object", "keras.saving.load_model",
    "keras.saving.load_weights", "keras.saving.register_keras_serializable",
    "keras.saving.save_model", "keras.utils.get_file"})
# tf_keras Lambda: each callable beside its "<name>_type" ("lambda": marshalled bytecode).
LAMBDA_TYPE_KEYS = ("function_type", "output_shape_type", "mask_type")
TRUST_HINT = "pass --trust-model to load it anyway"


@dataclasses.dataclass
class Finding:
    """One object in the config: where it is (the layer) and what it is."""

    layer: str          # "layer 'evil' (Lambda)"
    what: str           # "holds Python code that loading would run"

    def line(self) -> str:
        return f"{self.layer} {self.what}"


def read_config(path: Path) -> Optional[dict]:
    """The model config of a Keras file, as plain JSON; None when the file stores none (a
    weights-only .h5). A file neither format can read: ``InputError``."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                if "config.json" not in archive.namelist():
                    return None
                text = archive.read("config.json")
        else:
            import h5py
            with h5py.File(path, "r") as handle:
                text = handle.attrs.get("model_config")
                if text is None:
                    return None
    except (OSError, zipfile.BadZipFile, ValueError) as error:
        raise InputError(f"{path}: cannot read the Keras model ({first_line(error)})") from None
    try:
        config = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (ValueError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: the Keras model config is not valid JSON "
                         f"({first_line(error)})") from None
    return config if isinstance(config, dict) else None


def walk(config, layer: str = "the model") -> Iterator[Tuple[dict, str]]:
    """Every dict in the config, with the layer it belongs to (the nearest enclosing object
    that has a class and a name)."""
    if isinstance(config, list):
        for item in config:
            yield from walk(item, layer)
    elif isinstance(config, dict):
        here = _layer_of(config) or layer
        yield config, here
        for value in config.values():
            yield from walk(value, here)


def _layer_of(config: dict) -> Optional[str]:
    inner = config.get("config")
    if isinstance(config.get("class_name"), str) and isinstance(inner, dict) and \
            isinstance(inner.get("name"), str):
        return f"layer '{inner['name']}' ({config['class_name']})"
    return None


def unsafe_findings(config) -> List[Finding]:
    """What Keras' safe mode refuses: stored Python code and non-modeling APIs."""
    found: Dict[str, Finding] = {}
    non_modeling = _non_modeling_apis()
    for item, layer in walk(config):
        what = None
        if item.get("class_name") == "__lambda__" or _holds_lambda_code(item):
            what = "holds Python code that loading would run"
        elif isinstance(item.get("module"), str) and \
                f"{item['module']}.{_name_of(item)}" in non_modeling:
            what = f"calls {item['module']}.{_name_of(item)}, which is no modeling function"
        if what and layer + what not in found:
            found[layer + what] = Finding(layer, what)
    return list(found.values())


def _holds_lambda_code(item: dict) -> bool:
    """A tf_keras Lambda's config: a callable stored as marshalled bytecode."""
    if any(item.get(key) == "lambda" for key in LAMBDA_TYPE_KEYS):
        return True
    return "function_type" in item and isinstance(item.get("function"), list)


def _name_of(item: dict) -> str:
    """The Python name an object reference resolves: a function's config is its name."""
    if item.get("class_name") == "function" and isinstance(item.get("config"), str):
        return item["config"]
    return str(item.get("class_name"))


def _non_modeling_apis() -> frozenset:
    try:
        from keras.src.saving.serialization_lib import NON_MODELING_APIS as names
        return frozenset(names) | NON_MODELING_APIS
    except ImportError:
        return NON_MODELING_APIS


def missing_classes(config, custom_objects: Dict[str, object],
                    legacy_layers: bool = False) -> List[Finding]:
    """Classes and functions the config names that neither Keras nor the user's code provides.
    Objects saved with their module (Keras 3, recent tf_keras): any outside Keras' packages must be
    registered or in ``custom_objects`` (tf_keras would import the module the file names).
    ``legacy_layers``: also Keras 2 layer entries without a module (judged only after both
    loaders failed: a name is looked up in tf_keras' and Keras' layers)."""
    found: Dict[str, Finding] = {}
    for item, layer in walk(config):
        if not isinstance(item.get("class_name"), str) or item["class_name"].startswith("__"):
            continue
        if "module" in item:
            module = item["module"]
            if isinstance(module, str) and module.split(".")[0] in KERAS_PACKAGES:
                continue
        elif not (legacy_layers and "inbound_nodes" in item):
            continue
        names = {_name_of(item), str(item.get("registered_name") or "")} - {""}
        if any(_resolves(name, custom_objects) for name in names) or \
                ("module" not in item and _keras_layer(item["class_name"])):
            continue
        kind = "function" if item["class_name"] == "function" else "class"
        what = f"needs the {kind} '{_name_of(item)}'"
        found.setdefault(what, Finding(layer, what))
    return list(found.values())


def _kerases() -> list:
    """Keras 3 and tf_keras, those installed."""
    found = []
    try:
        import keras
        found.append(keras)
    except ImportError:
        pass
    try:
        import tf_keras
        found.append(tf_keras)
    except ImportError:
        pass
    return found


def _resolves(name: str, custom_objects: Dict[str, object]) -> bool:
    """Registered (``register_keras_serializable``) or offered as a custom object."""
    return name in custom_objects or any(
        keras.saving.get_registered_object(name) is not None for keras in _kerases())


def _keras_layer(name: str) -> bool:
    """A built-in layer or model class of tf_keras or Keras 3 (by its public name)."""
    return name in ("Functional", "TFOpLambda", "SlicingOpLambda") or any(
        inspect.isclass(getattr(getattr(keras, part, None), name, None))
        for keras in _kerases() for part in ("layers", "models"))


def refuse_unsafe(path: Path, config) -> List[Finding]:
    """``UnsafeModel`` (one line naming the layers) when the config holds what safe mode
    refuses; the findings otherwise (none)."""
    findings = unsafe_findings(config) if config is not None else []
    if findings:
        named = "; ".join(f.line() for f in findings)
        raise UnsafeModel(f"{path}: {named}; {TRUST_HINT}", [f.line() for f in findings])
    return findings


def refuse_missing(path: Path, config, custom_objects: Dict[str, object],
                   legacy_layers: bool = False) -> None:
    """One line naming the first class nothing provides, and the flag that provides it."""
    missing = missing_classes(config, custom_objects, legacy_layers) if config else []
    if missing:
        first = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(f"{path}: {first.line()}{more}, which is not registered; name the "
                         "module that defines it with --import MODULE")


# Keras 3's words when safe mode refuses what a file would run (serialization_lib, Lambda)
SAFE_MODE_REFUSALS = ("safe_mode", "enable_unsafe_deserialization")


def refuse_fallback(path: Path, keras3_error: Exception) -> None:
    """tf_keras (no safe mode for much of what it reads) loads only what Keras 3 cannot read as
    a format: a legacy HDF5 file. After Keras 3 refused the file in safe mode, or failed on a
    ``.keras`` archive (its own format), the fallback never runs: ``UnsafeModel`` or
    ``InputError``, one line."""
    text = str(keras3_error)
    if any(word in text for word in SAFE_MODE_REFUSALS):
        raise UnsafeModel(f"{path}: Keras 3 refused it in safe mode ({first_line(text)}); "
                          f"{TRUST_HINT}")
    if zipfile.is_zipfile(path):
        raise InputError(f"{path}: cannot load the Keras model ({first_line(text)})")


# ------------------------------------------------------------------ code the user names

def import_modules(specs: Sequence[str]) -> list:
    """``--import MODULE|PATH.py``, each imported (a module name from the current directory
    first); a module that cannot be imported: ``InputError``."""
    return [import_user_code(str(spec), "--import") for spec in specs]


def custom_objects(modules) -> Dict[str, object]:
    """The public classes and functions each module defines itself (not those it imported:
    a ``Dense`` imported from tf_keras must not stand in for Keras 3's), as a loader's
    ``custom_objects`` — what Keras 2 files with unregistered classes need."""
    found: Dict[str, object] = {}
    for module in modules:
        for name, value in vars(module).items():
            if not name.startswith("_") and (inspect.isclass(value) or
                                             inspect.isfunction(value)) and \
                    getattr(value, "__module__", None) == module.__name__:
                found[name] = value
    return found


def import_note(spec: str, module, offered: int) -> str:
    where = getattr(module, "__file__", None) or module.__name__
    return (f"imported {spec} ({where}): its registered classes resolve, and {offered} public "
            "classes/functions it defines are offered as custom objects")
