"""The command line: demo run, explicit interface, .pbtxt, and every bad input → exit 2."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2

from tfsurgery.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, cwd=None):
    """The real entry point in a subprocess: what a user sees, tracebacks included."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "optimize.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def load(path):
    gd = graph_pb2.GraphDef()
    data = Path(path).read_bytes()
    if str(path).endswith(".pbtxt"):
        text_format.Parse(data.decode(), gd)
    else:
        gd.ParseFromString(data)
    return gd


def test_demo_run_writes_a_verified_lean_graph(tmp_path):
    done = run_cli("--bn-fold", "--report-json", tmp_path / "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    out = tmp_path / "article_cnn_optimized.pb"
    assert str(out) in done.stdout and "verification: max error" in done.stdout
    ops = {n.op for n in load(out).node}
    assert not ops & {"Switch", "Merge", "FusedBatchNormV3", "RandomUniform"}
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verification"]["passed"] and report["verification"]["max_error"] < 1e-5
    assert report["after"]["nodes"] < report["before"]["nodes"]


def test_explicit_input_output_and_interface(article_pb, tmp_path, capsys):
    before = article_pb.read_bytes()
    out = tmp_path / "lean.pb"
    code = main(["optimize", str(article_pb), "-o", str(out), "--bn-fold", "--inputs", "input",
                 "--outputs", "output", "--report-json", str(tmp_path / "r.json")])
    assert code == 0
    assert article_pb.read_bytes() == before
    assert {"input", "output"} <= {n.name for n in load(out).node}
    text = capsys.readouterr().out
    assert "FusedBatchNormV3" in text and "| nodes" in text


def test_default_output_is_next_to_the_input(article_pb):
    assert main([str(article_pb), "-q"]) == 0
    out = article_pb.with_name("article_optimized.pb")
    assert out.exists()
    assert "FusedBatchNormV3" in {n.op for n in load(out).node}   # no --bn-fold: BN kept
    out.unlink()


def test_pbtxt_in_pbtxt_out(article, tmp_path):
    src = tmp_path / "model.pbtxt"
    src.write_text(text_format.MessageToString(article.graph_def))
    assert main([str(src), "--bn-fold", "-q"]) == 0
    out = tmp_path / "model_optimized.pbtxt"
    assert not {"Switch", "FusedBatchNormV3"} & {n.op for n in load(out).node}


def test_transforms_list_and_training_flag_options(article_pb, tmp_path):
    out = tmp_path / "only.pb"
    code = main([str(article_pb), "-o", str(out), "-q", "--transforms",
                 "freeze-training-flags,remove-switch-merge,prune", "--training-flag", "training"])
    assert code == 0
    ops = [n.op for n in load(out).node]
    assert "Switch" not in ops and "Identity" in ops and "FusedBatchNormV3" in ops


def test_inspect_is_a_dry_run(article_pb, tmp_path, capsys):
    code = main(["inspect", str(article_pb), "--bn-fold"])
    assert code == 0
    text = capsys.readouterr().out
    assert "inputs:  input" in text and "outputs: output" in text and "training" in text
    assert "fold-batch-norm" in text
    assert sorted(p.name for p in article_pb.parent.iterdir()) == ["article.pb"]


def test_verification_failure_exits_1_and_writes_nothing(article, tmp_path, monkeypatch, capsys):
    from tfsurgery.transforms import fold_batch_norm
    real = fold_batch_norm.batch_norm_step

    def off_by_a_bit(graph, name, lin):          # a folding bug: the shift is wrong
        step = real(graph, name, lin)
        return (step[0], step[1] + 0.1) if isinstance(step, tuple) else step

    monkeypatch.setattr(fold_batch_norm, "batch_norm_step", off_by_a_bit)
    src = tmp_path / "m.pb"
    src.write_bytes(article.graph_def.SerializeToString())
    assert main([str(src), "--bn-fold"]) == 1
    assert "verification FAILED" in capsys.readouterr().err
    assert not (tmp_path / "m_optimized.pb").exists()


def _bad_inputs(tmp, article):
    good = article.graph_def.SerializeToString()
    (tmp / "empty.pb").write_bytes(b"")
    (tmp / "truncated.pb").write_bytes(good[: len(good) // 2])
    (tmp / "image.pb").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(64))
    (tmp / "bad.pbtxt").write_text("node { name: 'a' op: ")
    (tmp / "adir").mkdir()
    return {
        "missing file": ([str(tmp / "nope.pb")], "no such file"),
        "empty file": ([str(tmp / "empty.pb")], "empty"),
        "truncated protobuf": ([str(tmp / "truncated.pb")], "not a valid"),
        "png renamed .pb": ([str(tmp / "image.pb")], "not a valid"),
        "malformed pbtxt": ([str(tmp / "bad.pbtxt")], "not a valid text GraphDef"),
        "directory": ([str(tmp / "adir")], "directory"),
        "unknown output": ([str(tmp / "good.pb"), "--outputs", "nope"], "unknown output"),
        "unknown input": ([str(tmp / "good.pb"), "--inputs", "nope"], "unknown input"),
        "unknown transform": ([str(tmp / "good.pb"), "--transforms", "fold-everything"],
                              "unknown transform"),
        "output over input": ([str(tmp / "good.pb"), "-o", str(tmp / "good.pb")],
                              "overwrite the input"),
        "output dir missing": ([str(tmp / "good.pb"), "-o", str(tmp / "no" / "x.pb")],
                               "does not exist"),
    }


def test_bad_inputs_exit_2_with_one_line_and_leave_files_alone(article, tmp_path, capsys):
    (tmp_path / "good.pb").write_bytes(article.graph_def.SerializeToString())
    cases = _bad_inputs(tmp_path, article)
    snapshot = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    for label, (argv, message) in cases.items():
        code = main(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2, label
        assert len(err.splitlines()) == 1 and message in err, (label, err)
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == snapshot


def test_bad_input_from_the_real_script_has_no_traceback(tmp_path):
    (tmp_path / "x.pb").write_bytes(b"garbage\x00\xff" * 10)
    done = run_cli(tmp_path / "x.pb")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("tfsurgery: error:")
