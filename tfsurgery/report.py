"""The before/after report: a table like onnxsim's, per-transform summaries, and JSON for CI."""
from __future__ import annotations

import collections
from typing import Dict, List, Optional, Sequence

from tfsurgery.contract import TransformReport


def op_histogram(graph_def) -> Dict[str, int]:
    return dict(collections.Counter(node.op for node in graph_def.node))


def summary(graph_def) -> dict:
    return {"nodes": len(graph_def.node), "bytes": graph_def.ByteSize(),
            "ops": op_histogram(graph_def)}


def comparison_rows(before: dict, after: dict) -> List[tuple]:
    """(label, before, after) for node count, bytes and every op whose count changed."""
    rows = [("nodes", before["nodes"], after["nodes"]), ("bytes", before["bytes"], after["bytes"])]
    ops = sorted(set(before["ops"]) | set(after["ops"]))
    rows += [(op, before["ops"].get(op, 0), after["ops"].get(op, 0)) for op in ops
             if before["ops"].get(op, 0) != after["ops"].get(op, 0)]
    return rows


def format_table(rows: Sequence[tuple], headers=("", "before", "after")) -> str:
    cells = [tuple(str(c) for c in headers)] + [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line]
    # a column of numbers (blank cells aside: a shorter side of a side-by-side table)
    numeric = [any(row[i] for row in cells[1:]) and
               all(_is_number(row[i]) for row in cells[1:] if row[i]) for i in range(len(headers))]
    for k, row in enumerate(cells):     # numbers right-aligned, text left-aligned
        out.append("| " + " | ".join(c.rjust(w) if numeric[i] and i else c.ljust(w)
                                     for i, (c, w) in enumerate(zip(row, widths))) + " |")
        if k == 0:
            out.append(line)
    out.append(line)
    return "\n".join(out)


def _is_number(text: str) -> bool:
    try:
        float(text.replace("±", "").split()[0] if text.strip() else "x")
        return True
    except ValueError:
        return False


def transform_lines(reports: Sequence[TransformReport], verbose: bool = False) -> List[str]:
    """One line per transform — what it changed, skipped and removed (added), in columns
    whatever the names; timings with ``verbose`` — then its skips and notes."""
    lines = []
    width = max((len(r.name) for r in reports), default=0)
    for r in reports:
        change = (f"removed {r.removed_nodes:>5}" if r.removed_nodes >= 0
                  else f"added   {-r.removed_nodes:>5}")      # add-preprocessing adds nodes
        timing = f"  ({r.seconds * 1000:.0f} ms)" if verbose else ""
        lines.append(f"{r.name:<{width}}  changed {len(r.rewritten):>4}, skipped "
                     f"{len(r.skipped):>3}, {change} nodes{timing}")
        for node, reason in r.skipped[: None if verbose else 10]:
            lines.append(f"    skipped {node}: {reason}")
        if not verbose and len(r.skipped) > 10:
            lines.append(f"    ... {len(r.skipped) - 10} more skips (use -v or --report-json)")
        lines.extend(f"    note: {note}" for note in r.notes)
    return lines


def build_report(before_def, after_def, reports: Sequence[TransformReport], *, inputs, outputs,
                 verification=None, extra: Optional[dict] = None) -> dict:
    result = {"inputs": list(inputs), "outputs": list(outputs), "before": summary(before_def),
              "after": summary(after_def), "transforms": [r.as_dict() for r in reports],
              "verification": verification.as_dict() if verification is not None else None}
    result.update(extra or {})
    return result
