"""The user's own Python code, imported only where the user names it: ``--plugin`` transforms
and ``--import`` Keras layers — by module name (importable from the current directory, as
``python -m`` would) or by the path of a ``.py`` file. A file gets a module name of its own per
path (two files both called layers.py do not collide) and loading it again gives the module
already loaded. Whatever the code raises at import: ``InputError`` naming the flag, one line.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from tfsurgery.errors import InputError
from tfsurgery.ops import first_line


def import_user_code(spec: str, flag: str):
    """The module ``spec`` names (``flag``: the option it came from, for the message)."""
    try:
        if spec.endswith(".py") or os.sep in spec:
            return _import_file(Path(spec), spec, flag)
        return _import_from_here(spec)
    except InputError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever the user's code raises at import
        raise InputError(f"{flag} {spec}: cannot load it: {first_line(error)}") from None


def _import_from_here(name: str):
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(name)
    finally:
        if added and here in sys.path:
            sys.path.remove(here)


def _import_file(path: Path, spec: str, flag: str):
    if not path.is_file():
        raise InputError(f"{flag} {spec}: no such file")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"tfsurgery_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
