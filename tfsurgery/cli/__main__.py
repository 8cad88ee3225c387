"""``python -m tfsurgery.cli ...``: the same as the ``tfsurgery`` command."""
import sys

from tfsurgery.cli import main

if __name__ == "__main__":
    sys.exit(main())
