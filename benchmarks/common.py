"""What the benchmark modules share (harness and deploy import it; it imports neither)."""
from __future__ import annotations

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
