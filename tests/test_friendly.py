"""The friendly parts: pictures, the bench subcommand, --version/--help, progress logging."""
import json

import pytest

from tfsurgery import __version__, api, picture
from tfsurgery.bench import latency
from tfsurgery.cli import main
from tfsurgery.errors import InputError


def test_picture_before_and_after(article_pb, tmp_path, capsys):
    out = tmp_path / "diff.svg"
    code = main([str(article_pb), "--bn-fold", "-o", str(tmp_path / "x.pb"), "--picture", str(out)])
    assert code == 0
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "before (150 nodes)" in svg
    assert "FusedBatchNormV3" in svg and "after (26 nodes)" in svg
    png = tmp_path / "scope.png"
    assert main(["inspect", str(article_pb), "--bn-fold", "--picture", str(png),
                 "--picture-scope", "backend/bn_1"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_picture_refuses_unknown_formats_and_huge_graphs(article, tmp_path, monkeypatch):
    with pytest.raises(InputError, match=".svg or .png"):
        picture.before_after(article.graph_def, article.graph_def, tmp_path / "x.pdf")
    monkeypatch.setattr(picture, "MAX_NODES", 10)
    with pytest.raises(InputError, match="--picture-scope"):
        picture.before_after(article.graph_def, article.graph_def, tmp_path / "x.svg")
    assert list(tmp_path.iterdir()) == []


def test_picture_too_big_to_draw_writes_nothing(article_pb, tmp_path, monkeypatch, capsys):
    """All or nothing: a drawing refused as too big leaves no .pb, JSON or picture behind —
    refused right after loading, and (should the optimized graph be the one too big) before
    anything is published."""
    args = [str(article_pb), "--bn-fold", "-o", str(tmp_path / "x.pb"), "--report-json",
            str(tmp_path / "r.json"), "--picture", str(tmp_path / "x.svg")]
    monkeypatch.setattr(picture, "MAX_NODES", 10)
    assert main(args) == 2
    assert "too many to draw" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(api, "check_drawable", lambda *a, **k: None)   # only the late check
    assert main(args) == 2
    assert "too many to draw" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_bench_subcommand_reports_both_runtimes(article_pb, tmp_path, capsys):
    report = tmp_path / "bench.json"
    assert main(["bench", str(article_pb), "--bn-fold", "--runs", "3",
                 "--runtimes", "tensorflow,onnxruntime", "--report-json", str(report)]) == 0
    text = capsys.readouterr().out
    assert "tensorflow" in text and "onnxruntime" in text and "speed-up" in text
    assert "each runtime in its own process" in text and "intra-op threads" in text
    timings = json.loads(report.read_text())["timings"]
    assert {(t["runtime"], t["variant"]) for t in timings} == {
        (r, v) for r in ("tensorflow", "onnxruntime") for v in ("original", "optimized")}
    assert all(t["median_ms"] > 0 for t in timings)


def test_interleaved_timing_takes_turns():
    calls = []
    times = latency.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                runs=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "b"] * 3
    assert [len(v) for v in times.values()] == [3, 3]


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and __version__ in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    text = capsys.readouterr().out
    assert "--bn-fold" in text and "examples:" in text


def test_verbose_logs_progress(article_pb, tmp_path, caplog):
    import logging
    with caplog.at_level(logging.DEBUG, logger="tfsurgery"):
        assert main([str(article_pb), "-v", "-o", str(tmp_path / "x.pb")]) == 0
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "verifying" in messages and "remove-switch-merge" in messages


def test_entry_points_reach_every_subcommand(article_pb, tmp_path):
    """scripts/optimize.py passes subcommands through, python -m tfsurgery works, --version works
    after the subcommand too, and a usage error has one prefix."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent

    def run(*args):
        return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                              cwd=tmp_path, timeout=300)
    inspected = run(root / "scripts" / "optimize.py", "inspect", article_pb, "--bn-fold")
    assert inspected.returncode == 0 and "dry run" in inspected.stdout, inspected.stderr
    assert "usage: tfsurgery export" in run(root / "scripts" / "optimize.py", "export",
                                            "--help").stdout
    for version in (run("-m", "tfsurgery", "--version"),
                    run("-m", "tfsurgery", "optimize", "--version")):
        assert version.returncode == 0 and __version__ in version.stdout
    bad = run("-m", "tfsurgery", "bench", "--runs", "x")
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1
    assert bad.stderr.startswith("tfsurgery: error: bench: "), bad.stderr


def test_long_runs_say_each_phase_and_q_silences_them(article_pb, tmp_path, caplog, monkeypatch):
    """Progress is by time, not graph size: past AFTER_SECONDS every phase gets a line (at INFO,
    shown by default); -q silences it. Here the threshold is 0 so the tiny demo counts as long."""
    import logging
    from tfsurgery import progress
    monkeypatch.setattr(progress, "AFTER_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="tfsurgery"):
        assert main([str(article_pb), "-o", str(tmp_path / "x.pb"), "--onnx",
                     str(tmp_path / "x.onnx")]) == 0
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    for phase in ("loading", "remove-switch-merge", "prune", "verifying", "exporting to ONNX"):
        assert any(phase in line for line in lines), (phase, lines)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tfsurgery"):
        assert main([str(article_pb), "-q", "-o", str(tmp_path / "y.pb")]) == 0
    assert not [r for r in caplog.records if r.levelno == logging.INFO and "[" in r.getMessage()]


def test_bench_says_when_the_spread_dwarfs_the_ratio():
    from tfsurgery.cli import _speedup
    from tfsurgery.bench.latency import Timing
    steady = Timing("tensorflow", "original", 1.00, 0.02, 2), \
        Timing("tensorflow", "optimized", 0.50, 0.02, 2)
    noisy = Timing("tensorflow", "original", 0.397, 0.025, 2), \
        Timing("tensorflow", "optimized", 0.322, 1.896, 2)
    assert _speedup(*steady) == "2.00x"
    assert _speedup(*noisy) == "≈ 1.23x (n.s.)"


def test_picture_finds_the_dot_beside_this_python(monkeypatch, tmp_path):
    """A virtualenv not activated: dot is not on PATH, but next to sys.executable."""
    import os
    import sys
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert picture._dot_program() == str(fake)
    assert os.path.dirname(picture._dot_program()) == str(tmp_path)
