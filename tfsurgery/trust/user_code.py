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
    before = set(sys.modules)
    try:
        if spec.endswith(".py") or os.sep in spec:
            module = _import_file(Path(spec), spec, flag)
        else:
            module = _import_from_here(spec)
    except InputError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever the user's code raises at import
        raise InputError(f"{flag} {spec}: cannot load it: {first_line(error)}") from None
    new = [sys.modules[name] for name in set(sys.modules) - before] + [module]
    _LOADED.setdefault(_key(spec), set()).update(_own_files(new))
    return module


# spec (resolved) → the user's own source files its import loaded (batch fingerprints them)
_LOADED: dict = {}


def loaded_files(spec: str, flag: str) -> list:
    """The user's own source files importing ``spec`` loaded — its module (every file of a
    package), and the modules of theirs it imported first — importing it if not yet done."""
    import_user_code(spec, flag)
    return sorted(_LOADED[_key(spec)])


def _key(spec: str) -> str:
    return str(Path(spec).resolve()) if spec.endswith(".py") or os.sep in spec else \
        f"{os.getcwd()}:{spec}"


def _own_files(modules) -> set:
    """The source files of ``modules`` outside the Python installation and tfsurgery (the
    user's own code); a package brings every .py file under its folder."""
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    installed |= {os.path.realpath(p) for p in sys.path if "-packages" in p}
    files = set()
    for module in modules:
        path = getattr(module, "__file__", None)
        ours = module.__name__ == "tfsurgery" or module.__name__.startswith("tfsurgery.")
        if not path or ours or any(os.path.realpath(path).startswith(root + os.sep)
                           for root in installed):
            continue
        if os.path.basename(path) == "__init__.py":
            files |= {str(p) for p in Path(path).parent.rglob("*.py")}
        files.add(str(Path(path).resolve()))
    return files


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
