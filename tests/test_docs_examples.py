"""Every python example of README.md and docs/*.md runs as written (the convention is at the top
of docs/README.md): a page's blocks in order, in one namespace, in a fresh directory holding
``frozen.pb`` (the demo CNN); a block marked ``<!-- no-run: why -->`` is skipped."""
import os

import pytest

from tfsurgery import pipeline
from docs_examples import NO_RUN, ROOT, pages, python_blocks

PAGES = [page for page in pages() if any(runs for _, _, runs in python_blocks(page))]


def test_the_convention_holds_and_new_pages_are_found():
    assert (ROOT / "docs" / "README.md") in pages()
    assert {"README.md", "python-api.md", "plugins.md", "training.md"} <= {p.name for p in PAGES}
    assert NO_RUN.search("<!-- no-run: needs a Keras ResNet50 -->")
    assert not NO_RUN.search("<!-- no-run: -->")           # a reason is required


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_examples_of_a_page_run(page, article, tmp_path, monkeypatch):
    (tmp_path / "frozen.pb").write_bytes(article.graph_def.SerializeToString())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pipeline, "USER", {})           # the page's own transforms stay there
    namespace = {"__name__": "__docs__"}
    for line, code, runs in python_blocks(page):
        if runs:
            source = "\n" * (line - 1) + code              # tracebacks point into the page
            exec(compile(source, str(page), "exec"), namespace)
    assert os.getcwd() == str(tmp_path)                  # no example wandered off


# ---------------------------------------------------------------- the command lines the docs show
def test_the_readmes_command_line_tour_runs_on_the_demo(tmp_path, monkeypatch, capsys):
    """Issue 41 item 6: the README's tour, each line as written, on the demo model as
    ``frozen.pb``; what it wrote checked by the tests' own oracle (TF sessions, onnxruntime)."""
    import numpy as np
    import onnxruntime
    import oracle
    from docs_examples import command_lines
    from tfsurgery.cli import main
    from tfsurgery.models.tf1 import article_cnn
    demo = article_cnn()                                  # what api.demo() is built from
    (tmp_path / "frozen.pb").write_bytes(demo.graph_def.SerializeToString())
    monkeypatch.chdir(tmp_path)
    tour = command_lines(ROOT / "README.md", "## A tour")
    assert [argv[:2] for argv in tour] == [["tfsurgery", command] for command in
                                           ("optimize", "inspect", "export", "bench")]
    printed = {}
    for argv in tour:
        assert main(argv[1:]) == 0, argv
        printed[argv[1]] = capsys.readouterr().out
    flags = {demo.training_flag: False}
    feeds = oracle.random_feeds(demo.graph_def, demo.inputs, seed=3)
    import tensorflow as tf
    optimized = tf.compat.v1.GraphDef.FromString((tmp_path / "frozen_optimized.pb").read_bytes())
    oracle.assert_same_outputs(demo.graph_def, optimized, demo.inputs, demo.outputs,
                               feeds=feeds, original_feeds=flags)
    expected, = oracle.run(demo.graph_def, {**feeds, **flags}, demo.outputs)
    session = onnxruntime.InferenceSession(str(tmp_path / "lean.onnx"),
                                           providers=["CPUExecutionProvider"])
    feed = {i.name: feeds[i.name.split(":")[0]] for i in session.get_inputs()}
    assert oracle.relative_error(expected, session.run(None, feed)[0]) <= 1e-4
    assert "dry run" in printed["inspect"] and "fastest checked" in printed["bench"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frozen.pb", "frozen_optimized.pb",
                                                          "lean.onnx"]
    assert np.isfinite(expected).all()


def _top1(expected, actual) -> float:
    import numpy as np
    return float(np.mean(np.argmax(expected, -1) == np.argmax(actual, -1)))


def test_the_int8_and_openvino_command_lines_run_on_a_tiny_fixture(tmp_path, monkeypatch,
                                                                     capsys):
    """Issue 41 item 6: every command line docs/int8.md and docs/openvino.md show, as written,
    on a tiny fixture — the small CNN trained on scikit-learn's digits as ``frozen.pb``, 797
    rows it never saw as ``rows.npz`` (enough gate rows for the default 0.99 agreement bound).
    What each wrote is checked by the tests' own oracle: TF sessions, onnxruntime, OpenVINO."""
    import numpy as np
    import onnxruntime
    import oracle
    from docs_examples import command_lines
    from int8_digits import TRAIN, digits_on_disk
    from tfsurgery.cli import main
    from tfsurgery.export import openvino as openvino_export
    _, images, _, graph_def = digits_on_disk(tmp_path)
    rows = images[TRAIN:]
    lines = command_lines(ROOT / "docs" / "int8.md") + command_lines(ROOT / "docs" /
                                                                     "openvino.md")
    assert len(lines) >= 5
    for number, argv in enumerate(lines):     # each in a folder of its own: they are
        text = " ".join(argv)                 # alternatives (two write lean_ir/)
        if "openvino" in text and not openvino_export.installed():
            continue
        folder = tmp_path / f"line{number}"
        folder.mkdir()
        (folder / "frozen.pb").write_bytes(graph_def.SerializeToString())
        np.savez(folder / "rows.npz", input=rows)
        monkeypatch.chdir(folder)
        code = main(argv[1:])
        err = capsys.readouterr().err
        precision = argv[argv.index("--openvino-precision") + 1] \
            if "--openvino-precision" in argv else "f32"
        if precision not in openvino_export.supported_precisions():
            assert code == 2 and len(err.strip().splitlines()) == 1, (text, err)
            continue
        if code == 1 and "below --int8-min-speedup" in err:   # int8 not faster here: refused
            assert "--quantize" in argv
            continue
        assert code == 0, (text, err)
    # the oracle on what was written
    outputs = [n.name for n in graph_def.node if n.op == "Identity"][-1:]
    expected, = oracle.run(graph_def, {"input": rows}, outputs)
    def written(name):
        return sorted(tmp_path.glob(f"line*/{name}"))

    for path in written("model_int8.onnx"):
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        actual = session.run(None, {session.get_inputs()[0].name: rows})[0]
        assert _top1(expected, actual) >= 0.97
    if openvino_export.installed():
        import openvino
        core = openvino.Core()
        assert written("lean_ir")                   # f32 always; bf16 where the CPU has it
        for folder in written("lean_ir") + written("lean_int8_ir"):
            compiled = core.compile_model(str(folder / "model.xml"), "CPU",
                                          {"INFERENCE_PRECISION_HINT": "f32"})
            actual = compiled(rows)[0]
            if folder.name == "lean_ir":
                assert oracle.relative_error(expected, actual) <= 1e-3
            else:
                assert _top1(expected, actual) >= 0.97
        assert written("bench.svg")[0].read_text().startswith("<svg")


def test_the_int8_python_example_runs_on_a_small_classifier(tmp_path, monkeypatch, capsys):
    """docs/int8.md's Python example as written, on the digits CNN as ``classifier.pb``: 397
    unseen rows with their labels as ``rows.npz``, 400 more as ``gate.npz``. Written or
    refused, the report rides along; what was written is checked in onnxruntime against TF."""
    import numpy as np
    import onnxruntime
    import oracle
    from docs_examples import marked_example
    from int8_digits import TRAIN, digits_on_disk
    _, images, labels, graph_def = digits_on_disk(tmp_path)
    (tmp_path / "classifier.pb").write_bytes(graph_def.SerializeToString())
    gate = slice(len(images) - 400, len(images))
    rows = slice(TRAIN, gate.start)
    np.savez(tmp_path / "rows.npz", input=images[rows], labels=labels[rows])
    np.savez(tmp_path / "gate.npz", input=images[gate], labels=labels[gate])
    monkeypatch.chdir(tmp_path)
    code, page = marked_example("<!-- int8-example")
    assert page.name == "int8.md"
    namespace = {"__name__": "__docs__"}
    exec(compile(code, str(page), "exec"), namespace)
    report = namespace["report"]
    assert report.gate_rows == 400 and report.accuracy is not None
    printed = capsys.readouterr().out
    assert str(report.gate_rows) in printed
    if (tmp_path / "classifier_int8.onnx").exists():
        outputs = [n.name for n in graph_def.node if n.op == "Identity"][-1:]
        expected, = oracle.run(graph_def, {"input": images[gate]}, outputs)
        session = onnxruntime.InferenceSession("classifier_int8.onnx",
                                               providers=["CPUExecutionProvider"])
        actual = session.run(None, {session.get_inputs()[0].name: images[gate]})[0]
        assert _top1(expected, actual) >= 0.97
        assert report.accuracy.passed and report.outputs[0].passed
    else:          # refused: by the gate or as not faster than float here; nothing written
        assert list(tmp_path.glob("classifier_int8*")) == []
