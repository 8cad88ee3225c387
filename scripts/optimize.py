#!/usr/bin/env python
"""The ``tfsurgery`` command without installing: ``python scripts/optimize.py [INPUT] [--bn-fold]
...`` optimizes (the default subcommand); ``python scripts/optimize.py inspect|export|bench ...``
runs the others. See ``--help``.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tfsurgery.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
