"""What a run will do: the transforms chosen by name (plugins registered), each one's own
parameters, the weight-storage transform and its tolerance."""
from __future__ import annotations

import dataclasses
import sys
from typing import Dict, List, Mapping, Optional, Sequence

from tfsurgery import pipeline
from tfsurgery.verify import check as verify_mod
from tfsurgery.contract import with_params
from tfsurgery.errors import InputError, UnknownTransform

# --store-weights float16: each weight is rounded to float16 (relative error up to 2^-11); through a
# few layers the outputs move by up to ~1e-3 of their magnitude, so verification allows 1e-2.
FLOAT16_TOLERANCE = 1e-2
# --store-weights int8: each weight moves by at most half its channel's step, max|W_c|/254 (0.4% of
# the channel's largest weight; about 1% of a layer's output magnitude, rms, for weights that
# look Gaussian). Compounded over a few layers and taken at the worst output element, outputs
# move by a few % of their magnitude: verification allows 5e-2 (and no top-1 flip beyond it).
INT8_WEIGHTS_TOLERANCE = 5e-2
WEIGHTS = ("float32", "float16", "int8")
WEIGHT_TRANSFORMS = {"float16": "float16-weights", "int8": "int8-weights"}


def choose_transforms(names: Sequence = (), *, bn_fold: bool = False, enable: Sequence[str] = (),
                      disable: Sequence[str] = ()) -> List[str]:
    """The transforms to run, by name: ``names`` in order (``"default"`` stands for the default
    pipeline; a function marked ``@tfsurgery.transform("name")`` is registered and named), else
    the defaults (+ BN folding), with ``enable``/``disable`` applied. Unknown: ``InputError``."""
    names = [name if isinstance(name, str) else pipeline.register(name, "python")
             for name in names]
    try:
        return pipeline.resolve_transforms(names, bn_fold=bn_fold, enable=enable,
                                           disable=disable)
    except UnknownTransform as error:
        raise InputError(str(error)) from None


def load_plugins(specs: Sequence[str]) -> List[str]:
    """``--plugin PATH.py|module.name``: register the transforms each defines (their names)."""
    return [name for spec in specs for name in pipeline.load_plugin(spec)]


def list_transforms() -> List[tuple]:
    """(name, when it runs, where it comes from, what it does) for ours and every plugin known
    (installed entry points included)."""
    pipeline.load_entry_points()
    rows = []
    for name in list(pipeline.ORDER) + list(pipeline.USER):
        fn = pipeline.lookup(name)
        plugin = getattr(fn, "plugin", None)
        when = ("when named" if plugin else "default" if fn.default
                else "--bn-fold" if name == "fold-batch-norm" else "opt-in")
        doc = (sys.modules[fn.__module__].__doc__ if not plugin else fn.__doc__) or \
            fn.__doc__ or ""
        doc = doc.strip()
        summary = doc.split("\n")[0].split(": ", 1)[-1] if doc else ""
        params = ", ".join(f"{f.name}={f.default!r}" if f.default is not dataclasses.MISSING
                           else f.name for f in dataclasses.fields(fn.params_type)
                           if f.name != "specs")
        rows.append((name, when, plugin or "tfsurgery", summary[:70], params))
    return rows


def transform_parameters(given: Optional[Mapping[str, Mapping[str, object]]] = None, *,
                         keep_asserts: bool = False, specs=None,
                         exact: bool = False) -> Dict[str, object]:
    """Each transform's own parameters for a run: ``given`` ({"fold-constants": {"max_bytes":
    1 << 20}}; values may be text, converted by the field's type), plus what the interface
    options decide (--keep-asserts, --exact, the preprocessing specs). Unknown names: ``InputError``."""
    params: Dict[str, object] = {}
    for name, values in dict(given or {}).items():
        fn = pipeline.lookup(name)
        if fn is None:
            raise InputError(f"--param {name}: unknown transform '{name}'")
        typed = {key: _typed(fn, key, value) for key, value in dict(values).items()}
        try:
            params[name] = with_params(fn, typed)
        except ValueError as error:
            raise InputError(f"--param {name}: {error}") from None
    if keep_asserts:
        params["strip-debug"] = dataclasses.replace(
            params.get("strip-debug") or pipeline.lookup("strip-debug").params_type(),
            keep_asserts=True)
    if exact:
        params["simplify-algebra"] = dataclasses.replace(
            params.get("simplify-algebra") or pipeline.lookup("simplify-algebra").params_type(),
            exact=True)
    if specs:
        params["add-preprocessing"] = dataclasses.replace(
            params.get("add-preprocessing") or
            pipeline.lookup("add-preprocessing").params_type(), specs=specs)
    return params


def _typed(fn, key: str, value):
    """A text value as the parameter's own type (bool, int, float; others as given)."""
    if not isinstance(value, str):
        return value
    default = next((f.default for f in dataclasses.fields(fn.params_type) if f.name == key), None)
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise InputError(f"--param {fn.transform_name}.{key}: {value!r} is not a "
                         f"{type(default).__name__}") from None
    return value


def with_weights(transforms: Sequence[str], weights: str):
    """The transforms for ``--store-weights`` (float16-weights or int8-weights last) and the default
    tolerance."""
    if weights not in WEIGHTS:
        raise InputError(f"--store-weights {weights}: choose one of {', '.join(WEIGHTS)}")
    if weights == "float32":
        return list(transforms), verify_mod.DEFAULT_TOLERANCE
    last = WEIGHT_TRANSFORMS[weights]
    return ([t for t in transforms if t not in WEIGHT_TRANSFORMS.values()] + [last],
            FLOAT16_TOLERANCE if weights == "float16" else INT8_WEIGHTS_TOLERANCE)
