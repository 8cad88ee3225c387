#!/usr/bin/env python
"""Optimize a frozen TensorFlow graph: ``python scripts/optimize.py [INPUT] [--bn-fold] ...``.

The same as ``tfsurgery optimize``; see ``--help``.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tfsurgery.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["optimize"] + sys.argv[1:]))
