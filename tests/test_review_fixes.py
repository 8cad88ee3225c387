"""Small items of the code review (../shared/REVIEW-2026-11-24.md §3.2-§3.4, §4), one test each:
names that say what they do, one helper per rule, a report that reads the way it counts."""
import numpy as np
import pytest

from conftest import source_of
from tfsurgery import api, io
from tfsurgery.export import artefacts
from tfsurgery.export import onnx as onnx_export
from tfsurgery.verify import check as verify
from tfsurgery.cli import _speedup, main
from tfsurgery.verify.compare import Comparison
from tfsurgery.bench.latency import Timing
from tfsurgery.int8.backends.onnx import Int8Report
from tfsurgery.int8.backends.tflite import TfliteInt8Report
from tfsurgery.report import format_table, transform_lines

import oracle


# ---------------------------------------------------------------- §3.2 names
def test_the_renamed_api_keeps_its_older_names(article):
    assert api.check_output_paths is api.check_outputs
    assert api.verify_result is api.check and api.feeds_for_checks is api.check_feeds
    assert verify.free_dim_size and not hasattr(verify, "test_size")   # pytest would collect it
    result = api.optimize(source_of(article), api.choose_transforms(bn_fold=True))
    assert result.original is result.before
    assert result.original_extra_feeds is result.settings == {"training": False}
    assert result.user_feeds is result.given == {}
    # the result's original is what the user gave; the optimized graph computes the same
    feeds = oracle.random_feeds(article.graph_def, article.inputs, seed=5)
    expected = oracle.run(result.original, {**feeds, "training": False}, article.outputs)[0]
    actual = oracle.run(result.graph_def, feeds, article.outputs)[0]
    assert oracle.relative_error(expected, actual) < 1e-5


def test_prune_reports_removals_not_rewrites(article):
    """The report said "prune rewrote 17": its work is nodes removed, counted as removed."""
    result = api.optimize(source_of(article), api.choose_transforms(bn_fold=True))
    prune = next(r for r in result.reports if r.name == "prune")
    assert prune.rewritten == [] and prune.removed
    assert prune.removed_nodes == len(prune.removed)
    assert not set(prune.removed) & {n.name for n in result.graph_def.node}
    assert set(prune.removed) <= {n.name for n in article.graph_def.node}
    line = next(l for l in transform_lines(result.reports) if l.startswith("prune "))
    assert "changed    0" in line and f"removed {prune.removed_nodes:>5} nodes" in line
    assert prune.as_dict()["removed"] == prune.removed
    switch_merge = next(r for r in result.reports if r.name == "remove-switch-merge")
    (note,) = [n for n in switch_merge.notes if "dead branches" in n]
    dead = int(note.split("removed, ")[1].split()[0])      # U6: one count, said once
    assert 0 < dead < switch_merge.removed_nodes


# ---------------------------------------------------------------- §3.3 one helper per rule
def test_nothing_compared_is_never_a_pass():
    """H5: an empty output list passes no check — verification, artefacts, compare, int8."""
    assert not verify.compared_real_numbers([])
    assert not verify.Verification([], 1e-4).passed
    assert not artefacts.compare({}, {})[2]
    assert not Comparison("a", "b", errors=[], ops={}, tolerance=1e-4, what="the outputs").passed
    for fmt in ("onnx", "tflite"):             # one report type for every int8 format
        assert not Int8Report(fmt, "x", 8, 8, 8, 1, outputs=[], selection_outputs=[],
                              plain_outputs=[]).passed
    assert TfliteInt8Report is Int8Report


def test_one_check_for_output_directories_and_the_input(tmp_path):
    missing = tmp_path / "no_such_dir"
    for check in (lambda p: io.output_directory(p), io.check_writable,
                  lambda p: onnx_export._check_target(p, None),
                  lambda p: artefacts.check_new_directory(p, False)):
        with pytest.raises(api.InputError, match="output directory .* does not exist"):
            check(missing / "out.x")
    model = tmp_path / "model"
    model.mkdir()
    (model / "saved_model.pb").write_bytes(b"")
    with pytest.raises(api.InputError, match="refusing to overwrite the input"):
        artefacts.check_new_directory(model, True, input_path=model)
    with pytest.raises(api.InputError, match="refusing to overwrite the input"):
        onnx_export._check_target(model / "saved_model.pb", model / "saved_model.pb")


def test_runs_are_checked_once_before_any_work(capsys):
    assert main(["bench", "--runs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("--runs must be at least 1, not 0") == 1 and len(err.splitlines()) == 1
    with pytest.raises(api.InputError, match="at least 1"):
        api.check_runs(0)


# ---------------------------------------------------------------- §4 UX
def test_side_by_side_counts_stay_numbers_under_named_headers():
    """U5: the TF-vs-ONNX table pads its shorter side with blanks; the counts stay
    right-aligned numbers and every column has a name."""
    table = format_table([("nodes", 120, "nodes", 9), ("Conv2D", 7, "Conv", 3),
                          ("FusedBatchNormV3", 1, "", "")],
                         headers=("TF after", "count", "ONNX", "count")).splitlines()
    assert len({len(line) for line in table}) == 1          # every row as wide
    header, first, last = table[1], table[3], table[5]
    assert header.split("|")[2].strip() == "count" and header.split("|")[4].strip() == "count"
    assert first.split("|")[2] == "   120 " and first.split("|")[4] == "     9 "
    assert last.split("|")[3].strip() == "" and last.split("|")[4].strip() == ""


def test_bench_says_not_significant_when_the_spreads_overlap():
    """U8: a ratio whose interquartile ranges overlap is printed as ≈ (n.s.)."""
    def t(median, spread):
        return Timing("tensorflow", "x", median, spread)
    assert _speedup(t(0.397, 0.025), t(0.322, 1.896)) == "≈ 1.23x (n.s.)"
    assert _speedup(t(2.0, 0.1), t(1.0, 0.1)) == "2.00x"
    assert _speedup(t(1.0, 0.0), Timing("onnxruntime", "x", None, None, skipped="no")) == "-"


def test_inspect_takes_no_verification_options(capsys):
    """U10: inspect never verifies, so --feed / --verify-timeout / --tolerance are unknown to
    it (one line, exit 2), as they are absent from its --help."""
    for option in (["--feed", "x=1"], ["--verify-timeout", "3"], ["--tolerance", "1e-3"]):
        assert main(["inspect", *option]) == 2
        err = capsys.readouterr().err
        assert f"unrecognized arguments: {option[0]}" in err and len(err.splitlines()) == 1
        assert err.count("tfsurgery:") == 1                # U4: no doubled prefix


def test_float_equality_of_the_demo_through_the_renamed_check(article):
    """api.verify_result (was api.check) re-verifies a result on the user's feeds."""
    result = api.optimize(source_of(article), api.choose_transforms(bn_fold=True))
    shape = [d.size for d in next(n for n in article.graph_def.node if n.name == "input")
             .attr["shape"].shape.dim]
    feeds = {"input": np.random.default_rng(9).standard_normal([2] + shape[1:])
             .astype(np.float32)}
    again = api.verify_result(result, feeds=feeds)
    assert again.passed and np.array_equal(again.feeds["input"], feeds["input"])


def test_op_sets_live_in_ops():
    """§3.3: the functional control-flow vocabulary is ops.py's, not a copy per module."""
    from tfsurgery import ops
    from tfsurgery.transforms import inline_functions
    assert io.FUNCTIONAL_CONTROL_FLOW is ops.FUNCTIONAL_CONTROL_FLOW_OPS
    assert inline_functions.LOOP_OPS is ops.FUNCTIONAL_WHILE_OPS
    assert inline_functions.IF_OPS | inline_functions.CASE_OPS | inline_functions.LOOP_OPS == \
        ops.FUNCTIONAL_CONTROL_FLOW_OPS
    assert inline_functions.CALL_OPS is ops.FUNCTION_CALL_OPS


DUPLICATE_FOLDS = """
import sys, numpy as np, tensorflow as tf
from tfsurgery import api
with tf.Graph().as_default() as g:
    x = tf.compat.v1.placeholder(tf.float32, [None, 12], name="input")
    outs = []
    for k in range(8):                       # 8 pairs of equal constant subgraphs to fold
        for twin in "ab":
            shape = tf.concat([tf.constant([-1], name=f"b{k}{twin}"),
                               tf.constant([3, 4], name=f"r{k}{twin}")], 0, name=f"s{k}{twin}")
            outs.append(tf.reshape(x * float(k + 1), shape))
    tf.identity(tf.add_n(outs), name="output")
result = api.optimize(g.as_graph_def(), ["fold-constants", "merge-duplicates", "prune"])
sys.stdout.buffer.write(result.graph_def.SerializeToString(deterministic=True))
"""


def test_the_same_input_gives_the_same_bytes_whatever_the_hash_seed():
    """fold-constants folded in a set's order, which Python's string hashing changes from one
    process to the next: merge-duplicates then kept a different twin, run to run."""
    import os
    import subprocess
    import sys
    import tensorflow as tf
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "TF_CPP_MIN_LOG_LEVEL": "3"}
        done = subprocess.run([sys.executable, "-c", DUPLICATE_FOLDS], capture_output=True,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    graph_def = tf.compat.v1.GraphDef.FromString(outputs[0])
    assert not {n.op for n in graph_def.node} & {"ConcatV2"}      # really folded
    x = np.random.default_rng(3).standard_normal((5, 12)).astype(np.float32)
    (actual,) = oracle.run(graph_def, {"input": x}, ["output"])
    expected = sum(np.reshape(x * (k + 1), (-1, 3, 4)) for k in range(8) for _ in "ab")
    assert oracle.relative_error(expected, actual) < 1e-6
