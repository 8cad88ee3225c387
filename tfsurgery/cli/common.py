"""What the subcommands share (private to the cli package): option parsing helpers, the
optimize call each makes, printing, and the verification verdict's exit status."""
from __future__ import annotations

import sys
from typing import List, Optional


def _split(text: Optional[str]) -> List[str]:
    return [part.strip() for part in text.split(",") if part.strip()] if text else []


def _preprocess(args):
    """The preprocessing options, parsed after logging is set up (parsing imports TensorFlow,
    whose start-up chatter would otherwise reach stderr); bad text: InputError, exit 2."""
    from tfsurgery import api
    return api.requested_preprocessing(args.input_dtype, args.reverse_input_channels,
                                       args.mean_values, args.scale_values)


def _params(given) -> dict:
    params: dict = {}
    for transform, name, value in given:
        params.setdefault(transform, {})[name] = value
    return params


def _interface(args):
    """The options that describe the graph's interface, as api.optimize takes them."""
    from tfsurgery import api
    return api.Interface(
        inputs=_split(args.inputs), outputs=_split(args.outputs),
        training_flags=[name for name, value in args.training_flag if value is None],
        inference_values={name: value for name, value in args.training_flag
                          if value is not None},
        input_shapes=dict(args.input_shape), feeds=dict(getattr(args, "feed", [])))


def _checks(args, verify: bool = True, tolerance=None):
    from tfsurgery import api
    return api.Checks(verify=verify, tolerance=tolerance,
                      timeout=getattr(args, "verify_timeout", None),
                      accept_blind_spots=getattr(args, "accept_blind_spots", False))


def _options(args, weights: Optional[str] = None):
    """api.optimize's other options: what the transforms do and what the checks run on."""
    from tfsurgery import api
    return api.RunOptions(keep_asserts=args.keep_asserts, preprocess=args.preprocess,
                          weights=weights or args.weights,
                          samples=getattr(args, "samples", None),
                          check_n=getattr(args, "check_n", 1),
                          transform_params=_params(args.param), exact=args.exact)


def _say(args, text: str = "") -> None:
    if not args.quiet:
        print(text)


def _size(nbytes: int) -> str:
    return f"{nbytes / 1024:.1f} KiB" if nbytes < 1 << 20 else f"{nbytes / (1 << 20):.1f} MiB"


def _optimized(api, source, transforms, args, *, verify: bool = True, tolerance=None,
               weights: Optional[str] = None):
    """The optimized result — also when its check failed (``VerificationFailed`` carries it):
    the CLI still prints what changed and why the check failed, then writes nothing."""
    try:
        return api.optimize(source, transforms, interface=_interface(args),
                            checks=_checks(args, verify, tolerance),
                            options=_options(args, weights))
    except api.VerificationFailed as failed:
        if failed.result is None:
            raise
        return failed.result


def _check_verification(args, result) -> int:
    if result.verification is not None:
        v = result.verification
        _say(args, f"verification: {v.summary()}")
        if not v.passed:
            where = f"; {result.divergence.line()}" if result.divergence else ""
            print(f"tfsurgery: verification FAILED: {v.failure()}{where}; nothing written",
                  file=sys.stderr)
            return 1
    elif result.verification_error:
        print(f"tfsurgery: verification FAILED: {result.verification_error}; nothing written",
              file=sys.stderr)
        return 1
    return 0

