"""Users' own transforms: the README's plugin (the article's fold(), found by pattern) through
--plugin, through an installed entry point and through the Python API — structure-checked,
verified and reported like ours; one that changes the numbers or raises writes nothing."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api, pipeline
from tfsurgery.cli import main

import oracle

ROOT = Path(__file__).resolve().parent.parent


def readme_plugin() -> str:
    """The plugin example of docs/plugins.md, as written there."""
    from docs_examples import marked_example
    return marked_example("<!-- plugin-example -->")[0]


@pytest.fixture
def users(monkeypatch):
    """A clean registry of users' transforms for each test."""
    monkeypatch.setattr(pipeline, "USER", {})


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "article_fold.py"
    path.write_text(readme_plugin())
    return path


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def test_the_readme_plugin_folds_the_article_by_pattern(users, article, article_pb, plugin_file,
                                                       tmp_path, capsys):
    out, report = tmp_path / "lean.pb", tmp_path / "r.json"
    code, stdout, err = run_cli(capsys, article_pb, "--plugin", plugin_file, "--transforms",
                                "default,article-fold", "-o", out, "--report-json", report)
    assert code == 0, err
    data = json.loads(report.read_text())
    mine = next(t for t in data["transforms"] if t["name"] == "article-fold")
    assert len(mine["rewritten"]) == 3 and any("user's transform" in n for n in mine["notes"])
    assert "article-fold" in stdout
    lean = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert not [n for n in lean.node if n.op.startswith("FusedBatchNorm")]
    oracle.assert_same_outputs(article.graph_def, lean, article.inputs, article.outputs,
                               original_feeds={"training": False}, rtol=1e-5)
    code, stdout, _ = run_cli(capsys, "--plugin", plugin_file, "--list-transforms")
    assert code == 0 and re.search(r"article-fold\s*\|\s*when named\s*\|.*article_fold\.py",
                                   stdout)


def test_the_python_api_takes_the_function_itself(users, article, plugin_file):
    namespace = {}
    exec(compile(plugin_file.read_text(), str(plugin_file), "exec"), namespace)
    source = api.Source(article.graph_def, "article", inputs=article.inputs,
                        outputs=article.outputs, training_flags=["training"])
    result = api.optimize(source, ["default", namespace["article_fold"]])
    assert [r for r in result.reports if r.name == "article-fold"][0].rewritten
    oracle.assert_same_outputs(article.graph_def, result.graph_def, article.inputs,
                               article.outputs, original_feeds={"training": False}, rtol=1e-5)


def test_an_installed_entry_point_runs_by_name(article_pb, plugin_file, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "article_plugin.py").write_text(plugin_file.read_text())
    info = site / "article_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: article-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[tfsurgery.transforms]\narticle-fold = article_plugin:article_fold\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "tfsurgery", "optimize", str(article_pb),
                           "--transforms", "default,article-fold", "-o", str(tmp_path / "x.pb"),
                           "--report-json", str(tmp_path / "r.json")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "r.json").read_text())
    mine = next(t for t in data["transforms"] if t["name"] == "article-fold")
    assert len(mine["rewritten"]) == 3
    assert any("entry point article_plugin:article_fold" in n for n in mine["notes"])


WRONG = '''
import tfsurgery

@tfsurgery.transform("scale-a-weight")
def scale_a_weight(graph, options):
    """Multiplies the last conv kernel by 1.05: the numbers move (every kernel of a saturating
    CNN and of MobileNetV2: tests/test_blind_spots.py)."""
    report = tfsurgery.TransformReport("scale-a-weight")
    conv = graph.nodes_with_ops({"Conv2D"})[-1]
    kernel = graph.inputs(conv.name)[1]
    graph.set_input(conv.name, 1, graph.add_const("scaled", graph.const_value(kernel) * 1.05))
    report.rewritten.append(conv.name)
    return report
'''

RAISES = '''
import tfsurgery

@tfsurgery.transform("broken-fix")
def broken_fix(graph, options):
    raise KeyError("no_such_node")
'''


@pytest.mark.parametrize("code, name, status, message", [
    (WRONG, "scale-a-weight", 1, "verification FAILED"),
    (RAISES, "broken-fix", 2, "transform 'broken-fix' (plugin "),
])
def test_a_plugin_that_breaks_things_writes_nothing(users, article_pb, tmp_path, capsys, code,
                                                    name, status, message):
    plugin = tmp_path / "mine.py"
    plugin.write_text(code)
    out = tmp_path / "out"
    out.mkdir()
    result, _, err = run_cli(capsys, article_pb, "--plugin", plugin, "--transforms",
                             f"default,{name}", "-o", out / "x.pb", "--onnx", out / "x.onnx")
    assert result == status and message in err and len(err.splitlines()) == 1, err
    assert list(out.iterdir()) == []


def test_bad_plugins_are_one_line(users, tmp_path, capsys):
    (tmp_path / "empty.py").write_text("x = 1\n")
    (tmp_path / "syntax.py").write_text("def (:\n")
    for path, message in ((tmp_path / "empty.py", "defines no transform"),
                          (tmp_path / "syntax.py", "cannot load it"),
                          (tmp_path / "missing.py", "no such file")):
        code, _, err = run_cli(capsys, "--plugin", path, "--list-transforms")
        assert code == 2 and message in err and len(err.splitlines()) == 1
    code, _, err = run_cli(capsys, "--transforms", "default,nobody-knows", "-o",
                           tmp_path / "x.pb")
    assert code == 2 and "unknown transform 'nobody-knows'" in err


def test_enable_and_disable_edit_the_default_pipeline():
    chosen = api.choose_transforms(enable=["fold-batch-norm"], disable=["merge-duplicates"])
    assert "fold-batch-norm" in chosen and "merge-duplicates" not in chosen
    assert chosen.index("fold-batch-norm") < chosen.index("fold-affine-into-linear")
    assert api.choose_transforms(["default"], bn_fold=True) == \
        api.choose_transforms(bn_fold=True)


def test_transforms_own_their_parameters(article_pb, tmp_path, capsys):
    """--param TRANSFORM.NAME=VALUE reaches that transform only; unknown names and bad values
    are one line."""
    from tfsurgery.transforms import fold_constants
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="input")
        scale = tf.math.rsqrt(tf.constant([1.0, 2.0, 3.0]) + 1e-3) * tf.constant([0.5, 1., 2.])
        tf.identity(x * scale, name="output")
    path = tmp_path / "bn.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    for value, folded in (("0", False), ("1048576", True)):
        report = tmp_path / f"r{value}.json"
        code, _, err = run_cli(capsys, path, "-o", tmp_path / f"x{value}.pb", "--param",
                               f"fold-constants.max_bytes={value}", "--report-json", report)
        assert code == 0, err
        folding = next(t for t in json.loads(report.read_text())["transforms"]
                       if t["name"] == "fold-constants")
        assert bool(folding["rewritten"]) == folded
        if not folded:
            assert "would grow" in folding["skipped"][0]["reason"] or \
                "bytes" in folding["skipped"][0]["reason"]
    assert fold_constants.FoldConstantsParams().max_bytes == 64 << 20   # defaults untouched
    for param, message in (("fold-constants.nope=1", "has no parameter 'nope'"),
                           ("no-such.x=1", "unknown transform 'no-such'"),
                           ("fold-constants.max_bytes=lots", "is not a int"),
                           ("fold-constants=1", "expected TRANSFORM.NAME=VALUE")):
        code, _, err = run_cli(capsys, article_pb, "-o", tmp_path / "y.pb", "--param", param)
        assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "y.pb").exists()


# ---------------------------------------------------------------- re-definitions
CELL = '''
import tfsurgery

@tfsurgery.transform("mine")
def mine(graph, options):
    return tfsurgery.TransformReport("mine", notes=["version {version}"])
'''


def test_a_notebook_cell_run_again_replaces_its_transform(users, article):
    """The issue's notebook: the cell defining @tfsurgery.transform("mine") runs again, then
    optimize(..., ["default", mine]) again: the new definition replaces the old and runs."""
    from conftest import assert_same_numbers, report_of, source_of
    for version in (1, 2):
        cell = {"__name__": "__main__"}            # what a notebook cell runs in
        exec(compile(CELL.format(version=version), "<cell>", "exec"), cell)
        result = api.optimize(source_of(article), ["default", cell["mine"]])
        assert pipeline.lookup("mine") is cell["mine"]
        assert report_of(result, "mine").notes[0] == f"version {version}"
    result.test_model = article
    assert_same_numbers(result)


def test_one_plugin_file_loaded_again_replaces_two_files_still_clash(users, tmp_path,
                                                                      monkeypatch):
    import importlib.util
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text(CELL.format(version=1))
    second.write_text(CELL.format(version=2))
    assert api.load_plugins([str(first)]) == ["mine"]
    with pytest.raises(api.InputError, match=r"'mine' is already registered by .*first\.py"):
        api.load_plugins([str(second)])
    # the same file imported again, under another module name: the same place, so it replaces
    spec = importlib.util.spec_from_file_location("first_again", first)
    again = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "first_again", again)
    spec.loader.exec_module(again)
    assert api.choose_transforms([again.mine]) == ["mine"]
    assert pipeline.lookup("mine") is again.mine
    with pytest.raises(api.InputError, match="already registered"):
        api.load_plugins([str(second)])          # still a different plugin
