"""Pictures of a graph before and after, like the article's TensorBoard screenshots.

An optional extra (``pip install 'tfsurgery[picture]'``): the DOT text comes from the ``graphviz``
package, the drawing from Graphviz's ``dot`` if installed, else ``graphviz-pure``. Constants are
left out (they are the weights, not the structure); ``scope`` keeps only nodes under a name prefix,
for graphs too big to read whole.
"""
from __future__ import annotations

import os
import shutil
import sys
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from tfsurgery.graph import Graph
from tfsurgery.errors import InputError
from tfsurgery.io import write_atomically
from tfsurgery.ops import (CONTROL_FLOW_V1_OPS, FOLDABLE_LINEAR_OPS, FUSED_BATCH_NORM_OPS,
                           PLACEHOLDER_OPS)

MAX_NODES = 1500            # beyond this a drawing is unreadable (and slow): ask for a scope
FORMATS = ("svg", "png")
COLOURS = {  # op families, so what a transform removed stands out
    **dict.fromkeys(CONTROL_FLOW_V1_OPS, "#f4a6a6"),
    **dict.fromkeys(FUSED_BATCH_NORM_OPS | {"Rsqrt"}, "#ffd27f"),
    **dict.fromkeys(FOLDABLE_LINEAR_OPS, "#a8c8ff"),
    **dict.fromkeys(PLACEHOLDER_OPS, "#eeeeee"),
    "RandomUniform": "#d7b5ff", "BiasAdd": "#bfe8c0",
}


def dot_source(graph_def, title: str, scope: Optional[str] = None):
    """A graphviz cluster for one graph (prefixing node ids with the title keeps two apart)."""
    import graphviz
    graph = Graph(graph_def, check_inputs=False)
    shown = check_drawable(graph_def, title, scope)
    names = {n.name for n in shown}
    cluster = graphviz.Digraph(name=f"cluster_{title}")
    cluster.attr(label=f"{title} ({len(graph_def.node)} nodes)", fontsize="20")
    for node in shown:
        short = node.name.rsplit("/", 1)[-1]
        cluster.node(f"{title}//{node.name}", f"{node.op}\n{short}", shape="box", style="filled",
                     fillcolor=COLOURS.get(node.op, "white"), tooltip=node.name, fontsize="10")
    for node in shown:
        for ref in graph.inputs(node.name):
            if ref.node in names:
                cluster.edge(f"{title}//{ref.node}", f"{title}//{node.name}")
        for control in graph.control_inputs(node.name):
            if control in names:
                cluster.edge(f"{title}//{control}", f"{title}//{node.name}", style="dashed")
    return cluster


HOW_TO_GET = "pip install 'tfsurgery[picture]' (or install Graphviz's dot and pip install graphviz)"


def check_drawable(graph_def, title: str, scope: Optional[str] = None) -> list:
    """The nodes a drawing shows (Consts left out, ``scope`` only); too many is bad input."""
    shown = [n for n in graph_def.node if n.op != "Const" and
             (not scope or n.name.startswith(scope))]
    if len(shown) > MAX_NODES:
        raise InputError(f"{title}: {len(shown)} nodes is too many to draw; pick a part with "
                         "--picture-scope PREFIX")
    return shown


def check_available() -> None:
    """Drawing needs the graphviz package (DOT text) and a dot program: an optional extra."""
    try:
        import graphviz  # noqa: F401
    except ImportError:
        raise InputError(f"--picture needs Graphviz: {HOW_TO_GET}") from None
    if _dot_program() is None:
        raise InputError(f"--picture needs a Graphviz dot program: {HOW_TO_GET}")


def _dot_program() -> Optional[str]:
    """Graphviz's dot on PATH, else the one the picture extra installed beside this Python
    (``venv/bin/python scripts/optimize.py`` without activating the virtualenv)."""
    here = os.path.dirname(sys.executable)
    return (shutil.which("dot") or shutil.which("graphviz-pure") or
            shutil.which("dot", path=here) or shutil.which("graphviz-pure", path=here))


def before_after(before, after, path, scope: Optional[str] = None) -> Path:
    """Draw both graphs side by side into ``path`` (.svg or .png), atomically."""
    path = Path(path)
    write_atomically(path, drawing(before, after, path, scope))
    return path


def drawing(before, after, path, scope: Optional[str] = None) -> bytes:
    """Both graphs side by side, rendered in ``path``'s format (.svg or .png), not written."""
    check_available()
    import graphviz
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise InputError(f"{path}: --picture must end in .svg or .png")
    both = graphviz.Digraph(graph_attr={"rankdir": "TB", "compound": "true"})
    both.subgraph(dot_source(before, "before", scope))
    both.subgraph(dot_source(after, "after", scope))
    return render(both.source, fmt)


def render(source: str, fmt: str) -> bytes:
    program = _dot_program()
    if program is None:
        raise InputError(f"--picture needs a Graphviz dot program: {HOW_TO_GET}")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "graph.gv", Path(tmp) / f"graph.{fmt}"
        src.write_text(source)
        done = subprocess.run([program, f"-T{fmt}", str(src), "-o", str(out)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not out.exists():
            message = (done.stderr.strip().splitlines() or ["no output"])[0]
            raise InputError(f"Graphviz could not draw the graph: {message}")
        return out.read_bytes()
