"""What each graph output is, read from the graph: class scores or values.

An output made by a Softmax/LogSoftmax (or an ArgMax of scores) — through the ops that only
pass it on — is **class scores**, judged by top-1 agreement; every other output (an embedding, a
regression, a transformer's hidden states, logits the graph never turns into classes) is
**values**, judged by SQNR, i.e. relative error (SQNR = −20·log10 of it), with the cosine
similarity reported beside: top-1 of an embedding means nothing. Labels or an agreement
threshold given by the user say the user reads a rank-2 output as classes (``None`` below: the
shape decides, as before this module).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from tfsurgery.ops import node_name

CLASS_HEADS = ("Softmax", "LogSoftmax", "ArgMax")
# ops that hand a tensor on unchanged in meaning: looked through to the head
PASS_THROUGH = ("Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Cast",
                "IdentityN", "PlaceholderWithDefault", "CheckNumerics", "Snapshot")
CLASSES, VALUES = "classes", "values"


def output_kinds(graph_def, outputs: Sequence[str], *, classes_asked: bool = False
                 ) -> Dict[str, Optional[str]]:
    """Each output's kind: CLASSES when a class head makes it, else VALUES — or None (the
    output's shape decides: rank 2, last dimension ≥ 2) when ``classes_asked`` (labels or an
    agreement threshold given) and the graph shows no head."""
    nodes = {node.name: node for node in graph_def.node}
    kinds: Dict[str, Optional[str]] = {}
    for output in outputs:
        head = _head(nodes, node_name(output))
        kinds[output] = CLASSES if head in CLASS_HEADS else (None if classes_asked else VALUES)
    return kinds


def _head(nodes, name: str) -> str:
    """The op type that made ``name``, looking through PASS_THROUGH ops."""
    seen = set()
    while name in nodes and name not in seen:
        seen.add(name)
        node = nodes[name]
        if node.op not in PASS_THROUGH or not node.input:
            return node.op
        name = node_name(node.input[0])
    return ""
