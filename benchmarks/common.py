"""What the benchmark modules share (harness and deploy import it; it imports neither)."""
from __future__ import annotations

import re
from typing import Sequence

from tfsurgery import api


def source_of(built) -> api.Source:
    flags = [built.training_flag] if built.training_flag else []
    return api.Source(built.graph_def, "benchmark", inputs=list(built.inputs),
                      outputs=list(built.outputs), training_flags=flags)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence], align: str = "") -> str:
    align = align or "l" + "r" * (len(header) - 1)
    marks = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def splice_section(document: str, title: str, section: str) -> str:
    """``document`` with its ``title`` section (up to the next "## ") replaced by ``section``,
    appended if it has none."""
    pattern = re.compile(rf"^{re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(document):
        return pattern.sub(lambda _: section.rstrip("\n") + "\n\n", document, count=1)
    return document.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
