"""Command line: ``tfsurgery optimize|inspect|export|bench|compare|batch ...``, ``python -m tfsurgery``
and ``python scripts/optimize.py ...``. The grammar is in ``parser``, the work in ``commands``
(``bench`` and ``int8_report`` print those results, ``common`` holds what they share; all through
the API only); here, ``main``: parse, set up logging, run, map errors to exit statuses.

Exit status: 0 success, 1 verification failed (TF graphs or ONNX vs TF, or ONNX conversion failed),
2 bad input (one line on stderr, no traceback), a package the work needs not installed included.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import List, Optional

from tfsurgery.cli.bench import _speedup  # noqa: F401 - tests use it
from tfsurgery.cli.commands import run
from tfsurgery.cli.parser import SUBCOMMANDS, UsageError, build_parser, parse_args  # noqa: F401

log = logging.getLogger("tfsurgery")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--version" in argv[:argv.index("--")] if "--" in argv else "--version" in argv:
        argv = ["--version"]                      # anywhere: before or after the subcommand
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["optimize"] + argv
    try:
        args = parse_args(argv)
    except UsageError as error:
        print(f"tfsurgery: error: {error}", file=sys.stderr)
        return 2
    _setup_logging(args)
    from tfsurgery import api
    from tfsurgery.api import InputError, StructureError
    api.progress.start()
    try:
        with api.outside.allowing(getattr(args, "allow_op", None) or ()):
            return run(args)
    except InputError as error:
        print(f"tfsurgery: error: {error}", file=sys.stderr)
        return 2
    except StructureError as error:
        print(f"tfsurgery: FAILED: {error}; nothing written", file=sys.stderr)
        return 1
    except ImportError as error:          # an optional package the asked-for work needs
        print(f"tfsurgery: error: {api.MissingPackage.of(error, f'tfsurgery {args.command}')}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tfsurgery: interrupted", file=sys.stderr)
        return 130


def _setup_logging(args) -> None:
    if not args.verbose:
        _silence_native_stderr()
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    logging.getLogger("tfsurgery").setLevel(level)     # also where logging was set up before
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")      # before TensorFlow is imported
    import tensorflow as tf
    tf.get_logger().setLevel(logging.DEBUG if args.verbose else logging.ERROR)
    # tf2onnx logs its progress at INFO and unsupported ops at ERROR; we report those ourselves.
    logging.getLogger("tf2onnx").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL)
    # absl logs at INFO through Python logging (the SavedModel builder's "Writing fingerprint").
    logging.getLogger("absl").setLevel(logging.DEBUG if args.verbose else logging.WARNING)


def _silence_native_stderr() -> None:
    """TensorFlow's C++ runtime writes start-up chatter (oneDNN, CUDA probing) straight to file
    descriptor 2, ignoring TF_CPP_MIN_LOG_LEVEL. Point fd 2 at /dev/null and give Python's
    sys.stderr a private copy of the real one, so our own messages still get through."""
    if getattr(_silence_native_stderr, "done", False) or sys.stderr is not sys.__stderr__:
        return                # already done, or stderr is captured (tests, notebooks)
    try:
        sys.stderr.flush()
        real = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        sys.stderr = os.fdopen(real, "w", buffering=1)
        _silence_native_stderr.done = True
    except (OSError, ValueError, AttributeError):
        pass                  # no real fd 2 (embedded interpreters, captured streams): keep it
