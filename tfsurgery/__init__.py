"""tfsurgery: make trained TensorFlow graphs lean for inference, and prove the numbers held."""
import os as _os

__version__ = "0.1.0"

# The repository keeps transforms/ and models/ beside this folder; setup.py installs them as
# tfsurgery.transforms and tfsurgery.models (package_dir). A source checkout run without installing
# (scripts/, a git worktree) maps them the same way, so the code never imports them otherwise.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "setup.py")) and \
        _os.path.isfile(_os.path.join(_checkout, "transforms", "__init__.py")):
    __path__.append(_checkout)
