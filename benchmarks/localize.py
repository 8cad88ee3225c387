"""How long localizing a failed check takes, against the verification's own time, on one model:
a batch-norm fold broken on purpose (every fold's scale off by 0.1), then

- verification: the time ``api.check`` takes on the correct result (two runs of each graph and
  the second size, as every optimize run pays);
- localization: the time ``api._localize`` takes after the broken run failed (the bisection of
  the pipeline, each step verified, then every common tensor before and after the transform).

The ratio is what a user waits, in verifications, to learn where it broke.
"""
from __future__ import annotations

import time

from benchmarks.common import markdown_table, source_of
from tfsurgery import api
from tfsurgery.transforms import fold_batch_norm


def measure(name: str, built) -> dict:
    source = source_of(built)
    transforms = api.choose_transforms(bn_fold=True)
    correct = api.optimize(source, transforms, checks=api.Checks(verify=False))
    start = time.perf_counter()
    api.verify_result(correct)
    verification = time.perf_counter() - start
    spent = {}
    real_localize, real_fold = api._localize, fold_batch_norm.fold_into

    def timed(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return real_localize(*args, **kwargs)
        finally:
            spent["localize"] = time.perf_counter() - begin

    def broken(graph, lin, scale, shift, *args):
        return real_fold(graph, lin, scale + 0.1, shift, *args)     # every fold's scale off
    api._localize, fold_batch_norm.fold_into = timed, broken
    try:
        api.optimize(source, transforms)
        found = None
    except api.VerificationFailed as failed:
        found = failed.result.divergence
    finally:
        api._localize, fold_batch_norm.fold_into = real_localize, real_fold
    return {"model": name, "nodes": len(built.graph_def.node),
            "verification_seconds": verification, "localize_seconds": spent.get("localize"),
            "ratio": spent.get("localize", float("nan")) / verification,
            "transform": found.transform if found else None,
            "node": found.node if found else None, "compared": found.compared if found else 0}


def render(rows) -> str:
    return markdown_table(
        ["model", "nodes", "verification", "localization", "ratio", "named", "tensors compared"],
        [[r["model"], r["nodes"], f"{r['verification_seconds']:.2f} s",
          f"{r['localize_seconds']:.2f} s", f"{r['ratio']:.1f}×",
          f"{r['transform']} / {r['node']}", r["compared"]] for r in rows])
