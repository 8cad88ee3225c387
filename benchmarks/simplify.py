"""Peer simplification cases (issue 23): tfsurgery against Grappler on the peers' own test graphs.

For every case of ``benchmarks/peer_graphs.py``, in one run:

- **original**: node count and op histogram;
- **tfsurgery**: ``api.optimize`` with the ``--bn-fold`` defaults (no verification: the
  outputs are compared here, as for the others);
- **grappler**: offline Grappler (``tf_optimizer.OptimizeGraph``) with a default ``ConfigProto``
  (the meta optimizer's default optimizers and iterations), the outputs as fetch nodes;
- **aggressive**: the same with constant folding and the arithmetic optimizer set to
  ``AGGRESSIVE``;

and for each result whether its outputs equal the original's (same seeded feeds, each graph in
its own session, NCHW ops through ``cpu_layout`` where the CPU needs it) and whether it meets
what the peer test expects. ``python scripts/benchmark.py --peer-graphs`` writes the section into
``docs/benchmark.md``.
"""
from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional

from benchmarks import harness
from benchmarks.common import markdown_table, source_of, splice_section
from benchmarks.peer_graphs import CASES, Case, histogram
from tfsurgery import api
from tfsurgery.verify import check as verify
from tfsurgery.ops import first_line

VARIANTS = ("tfsurgery", "grappler", "aggressive")
TOLERANCE = 1e-5            # max relative error for "same outputs"
SECTION = "## Peer simplification cases"


def grappler_default_config():
    from tensorflow.core.protobuf import config_pb2
    return config_pb2.ConfigProto()


def grappler_aggressive_config():
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.constant_folding = rewriter_config_pb2.RewriterConfig.AGGRESSIVE
    rewrite.arithmetic_optimization = rewriter_config_pb2.RewriterConfig.AGGRESSIVE
    return config


def run_tfsurgery(built):
    return api.optimize(source_of(built), api.choose_transforms(bn_fold=True),
                        checks=api.Checks(verify=False)).graph_def


def run_grappler(built, config):
    graph_def = harness.run_grappler(harness.grappler_meta_graph(built), config)
    missing = [name for name in built.outputs if name not in {n.name for n in graph_def.node}]
    if missing:
        raise RuntimeError(f"fetch node(s) {', '.join(missing)} not preserved")
    return graph_def


def compare(built, graph_def, feeds, reference) -> float:
    """Max relative error of ``graph_def``'s outputs against the original's (inf: shape or
    NaN/Inf placement differs; for bool/int outputs, the count of differing elements)."""
    actual = verify.run_graph(graph_def, feeds, built.outputs)
    return max(verify.output_error(name, e, a).max_rel
               for name, e, a in zip(built.outputs, reference, actual))


def input_shapes(built) -> Dict[str, list]:
    """Each input's declared shape (None: a free dimension)."""
    import tensorflow as tf
    nodes = {n.name: n for n in built.graph_def.node}
    return {name: tf.TensorShape(nodes[name].attr["shape"].shape).as_list()
            for name in built.inputs}


def interface_text(row: dict) -> str:
    shapes = ", ".join(f"{name} {'×'.join('?' if d is None else str(d) for d in shape)}"
                       for name, shape in row["inputs"].items())
    return f"{shapes} → {', '.join(row['outputs'])}"


def measure_case(case: Case, seed: int = 0) -> dict:
    built = case.build()
    original = histogram(built.graph_def)
    row = {"name": case.name, "group": case.group, "peer": case.peer,
           "peer_file": case.peer_file,
           "expects": case.expects, "inputs": input_shapes(built), "outputs": list(built.outputs),
           "original": {"nodes": len(built.graph_def.node), "histogram": original,
                        "expected": bool(case.expected(original))}}
    feeds = verify.make_feeds(built.graph_def, built.inputs, seed)
    reference = verify.run_graph(built.graph_def, feeds, built.outputs)
    runners: Dict[str, Callable] = {
        "tfsurgery": lambda: run_tfsurgery(built),
        "grappler": lambda: run_grappler(built, grappler_default_config()),
        "aggressive": lambda: run_grappler(built, grappler_aggressive_config()),
    }
    for variant, runner in runners.items():
        try:
            graph_def = runner()
        except Exception as error:     # a refusal or a peer's failure is a result
            row[variant] = {"error": f"{type(error).__name__}: {first_line(error)}"}
            continue
        hist = histogram(graph_def)
        entry = {"nodes": len(graph_def.node), "histogram": hist,
                 "expected": bool(case.expected(hist))}
        try:
            entry["max_error"] = compare(built, graph_def, feeds, reference)
        except verify.VerificationError as error:
            entry["max_error"] = None
            entry["run_error"] = first_line(error)
        entry["same"] = entry["max_error"] is not None and entry["max_error"] <= TOLERANCE
        row[variant] = entry
    return row


def run(cases=None, log: Callable[[str], None] = lambda _: None) -> dict:
    rows = []
    for case in cases or CASES:
        log(f"peer case {case.name}")
        rows.append(measure_case(case))
    import datetime
    import tensorflow as tf
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {"tolerance": TOLERANCE, "tensorflow": tf.__version__, "date": when, "cases": rows,
            "summary": summarize(rows)}


# ---------------------------------------------------------------- summary
def _nodes(row, variant) -> Optional[int]:
    return row[variant].get("nodes") if row[variant].get("same") else None


def summarize(rows: List[dict]) -> dict:
    """Counts over the cases where both results exist and keep the outputs; the misses:
    cases where tfsurgery has more nodes than Grappler (default or aggressive), or fails."""
    summary = {"cases": len(rows)}
    for peer in ("grappler", "aggressive"):
        compared = [r for r in rows if _nodes(r, "tfsurgery") is not None
                    and _nodes(r, peer) is not None]
        summary[f"le_{peer}"] = sum(_nodes(r, "tfsurgery") <= _nodes(r, peer) for r in compared)
        summary[f"lt_{peer}"] = sum(_nodes(r, "tfsurgery") < _nodes(r, peer) for r in compared)
        summary[f"compared_{peer}"] = len(compared)
    for variant in VARIANTS:
        summary[f"expected_{variant}"] = sum(bool(r[variant].get("expected")) and
                                             bool(r[variant].get("same")) for r in rows)
        summary[f"same_{variant}"] = sum(bool(r[variant].get("same")) for r in rows)
    summary["misses"] = [miss(r) for r in rows if is_miss(r)]
    return summary


def is_miss(row: dict) -> bool:
    ours = _nodes(row, "tfsurgery")
    if ours is None:
        return True
    best = [_nodes(row, p) for p in ("grappler", "aggressive") if _nodes(row, p) is not None]
    return bool(best) and ours > min(best)


def miss(row: dict) -> dict:
    """What tfsurgery keeps that the best Grappler result does not (op → count difference)."""
    ours = row["tfsurgery"].get("histogram", {})
    peers = [p for p in ("aggressive", "grappler") if _nodes(row, p) is not None]
    best = min(peers, key=lambda p: _nodes(row, p)) if peers else None
    theirs = row[best]["histogram"] if best else {}
    extra = {op: ours.get(op, 0) - theirs.get(op, 0) for op in sorted(set(ours) | set(theirs))
             if ours.get(op, 0) != theirs.get(op, 0)}
    return {"name": row["name"], "peer": row["peer"], "expects": row["expects"],
            "tfsurgery": _nodes(row, "tfsurgery"),
            "tfsurgery_error": row["tfsurgery"].get("error") or row["tfsurgery"].get("run_error")
            or (None if row["tfsurgery"].get("same") else "outputs differ"),
            "best_peer": best, "best_peer_nodes": _nodes(row, best) if best else None,
            "difference": extra}


# ---------------------------------------------------------------- Markdown
def fmt_variant(entry: dict) -> str:
    if "error" in entry:
        return f"error: {entry['error'][:60]}"
    text = str(entry["nodes"])
    if not entry.get("same"):
        err = entry.get("max_error")
        text += " (outputs differ" + (f": {err:.1e})" if err is not None else
                                       f": {entry.get('run_error', '?')[:50]})")
    return text + (" ✓" if entry.get("expected") else "")


def histogram_text(hist: dict) -> str:
    return ", ".join(f"{n} {op}" for op, n in sorted(hist.items(), key=lambda i: (-i[1], i[0])))


def difference_text(diff: dict) -> str:
    return ", ".join(f"{'+' if n > 0 else ''}{n} {op}" for op, n in diff.items()) or "–"


def render(result: dict) -> str:
    rows = result["cases"]
    s = result["summary"]
    table = markdown_table(
        ["case", "peer test", "inputs → outputs", "peer expects", "original", "tfsurgery",
         "Grappler default", "Grappler AGGRESSIVE"],
        [[r["name"], f"{r['peer']}", interface_text(r), r["expects"],
          f"{r['original']['nodes']}" + (" ✓" if r["original"]["expected"] else ""),
          *[fmt_variant(r[v]) for v in VARIANTS]] for r in rows], "llllrrrr")
    misses = s["misses"]
    miss_rows = [[m["name"], m["tfsurgery"] if m["tfsurgery"] is not None
                  else m["tfsurgery_error"], f"{m['best_peer_nodes']} ({m['best_peer']})",
                  difference_text(m["difference"])] for m in misses]
    files = sorted({(r["peer"].split()[0], r["peer_file"]) for r in rows})
    lines = [
        SECTION,
        "",
        f"{s['cases']} small frozen TF1 graphs re-creating the input graphs of our peers' "
        "simplification tests (`benchmarks/peer_graphs.py`: each names the peer test; seeded "
        "random values, placeholders where the peer used variables). Regenerate with "
        "`python scripts/benchmark.py --peer-graphs`. Node counts after: **tfsurgery** = "
        "`api.optimize(..., choose_transforms(bn_fold=True), checks=Checks(verify=False))`; **Grappler default** "
        "= `tf_optimizer.OptimizeGraph` with a default `ConfigProto` (the default optimizers and "
        "iterations); **Grappler AGGRESSIVE** = the same with `constant_folding` and "
        "`arithmetic_optimization` set to `AGGRESSIVE`; both with the outputs as fetch nodes. "
        f"Each result's outputs are compared with the original's (same seeded feeds, separate "
        f"sessions, NCHW ops through `cpu_layout`): *outputs differ* = max relative error above "
        f"{result['tolerance']:g} (or the graph does not run). ✓ = meets the peer test's "
        "expectation (column *peer expects*, checked on the op histogram). "
        f"TensorFlow {result.get('tensorflow', '?')}, {result.get('date', '?')}.",
        "",
        f"- tfsurgery ≤ Grappler default on **{s['le_grappler']} of {s['compared_grappler']}** "
        f"cases (fewer on {s['lt_grappler']}); ≤ Grappler AGGRESSIVE on "
        f"**{s['le_aggressive']} of {s['compared_aggressive']}** (fewer on {s['lt_aggressive']}) "
        "— counted where both results keep the outputs.",
        f"- Peer expectation met (outputs kept): tfsurgery {s['expected_tfsurgery']}, Grappler "
        f"default {s['expected_grappler']}, Grappler AGGRESSIVE {s['expected_aggressive']} of "
        f"{s['cases']}; outputs equal: tfsurgery {s['same_tfsurgery']}, Grappler default "
        f"{s['same_grappler']}, AGGRESSIVE {s['same_aggressive']}.",
        f"- tfsurgery has more nodes than the best Grappler result (or fails) on "
        f"**{len(misses)}** cases" + (": " + ", ".join(m["name"] for m in misses) + "."
                                      if misses else "."),
        "",
        table,
        "",
    ]
    if miss_rows:
        lines += ["### Where tfsurgery keeps more", "",
                  "Op counts tfsurgery's result has beyond the best Grappler result (+) or "
                  "fewer (−).", "",
                  markdown_table(["case", "tfsurgery", "best Grappler", "difference"],
                                 miss_rows, "lrrl"), ""]
    lines += ["Peer files: " + "; ".join(f"{abbr} = `{path}`" for abbr, path in files) + ".", ""]
    return "\n".join(lines)


def splice(document: str, section: str) -> str:
    """``document`` with its peer section replaced by ``section`` (appended if it has none)."""
    return splice_section(document, SECTION, section)


def section_of(document: str) -> Optional[str]:
    match = re.search(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", document, re.S | re.M)
    return match.group(0) if match else None


def render_misses(result: dict) -> str:
    """The misses, grouped as the cases are, for the engineers fixing them: per case the node
    counts (original → tfsurgery / Grappler default / AGGRESSIVE), what tfsurgery keeps beyond
    the best Grappler result, and what the peer expects; then the cases nobody meets."""
    rows = {r["name"]: r for r in result["cases"]}
    s = result["summary"]

    def counts(r):
        return " / ".join(str(r[v].get("nodes", "error")) for v in VARIANTS)

    lines = [f"{s['cases']} cases; tfsurgery ≤ Grappler default on {s['le_grappler']}, ≤ "
             f"AGGRESSIVE on {s['le_aggressive']}. Per miss: original → tfsurgery / Grappler "
             "default / AGGRESSIVE nodes — what tfsurgery keeps beyond the best Grappler result "
             "(+N op) or has fewer of (−N op) — what the peer test expects.", ""]
    groups: Dict[str, List[str]] = {}
    for m in s["misses"]:
        r = rows[m["name"]]
        note = f" ({m['tfsurgery_error']})" if m["tfsurgery_error"] else ""
        groups.setdefault(r.get("group") or "other", []).append(
            f"- **{m['name']}** ({m['peer']}) — {r['original']['nodes']} → {counts(r)}{note} — "
            f"keeps: {difference_text(m['difference'])} — peer expects: {m['expects']}")
    for title, items in groups.items():
        lines += [f"### {title}", "", *items, ""]
    nobody = [r for r in result["cases"] if not any(r[v].get("expected") for v in VARIANTS)]
    if nobody:
        lines += ["### No one meets the peer's expectation", ""]
        lines += [f"- **{r['name']}** ({r['peer']}) — {r['original']['nodes']} → {counts(r)} — "
                  f"peer expects: {r['expects']}" for r in nobody]
    return "\n".join(lines) + "\n"
