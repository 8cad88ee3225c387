"""``api.write``: the CLI's export sequence is the API's. For several option sets the CLI and
``api.optimize`` + ``api.write`` write the same files (byte for byte where the writer is
deterministic) and the same artefact records; a failed check writes nothing through either."""
import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tensorflow as tf

import oracle
from test_plugins import WRONG
from tfsurgery import api, pipeline
from tfsurgery.export import onnx as onnx_export
from tfsurgery.cli import main

ROOT = Path(__file__).resolve().parent.parent


def tf_run(graph_def, feeds, output):
    return oracle.run(graph_def, feeds, [output])[0]


def comparable(records, folder):
    """Artefact records with the output folder taken out of their paths. Two sizes are not
    reproducible within one process, whoever writes: an ONNX model's differs by the digits of
    tf2onnx's process-wide name counter (``NAME__6`` in one conversion, ``NAME__37`` in the
    next; compared by ``same_onnx`` instead), a SavedModel's by a byte of TensorFlow's
    fingerprint."""
    text = json.dumps(records, sort_keys=True).replace(str(folder), "OUT")
    if isinstance(records, dict):
        return json.loads(text)
    return [{k: v for k, v in r.items() if not (r["format"] in UNSTABLE_SIZE and k == "bytes")}
            for r in json.loads(text)]


UNSTABLE_SIZE = ("onnx", "saved_model")


def same_onnx(a, b):
    """Two ONNX files equal up to tf2onnx's unique-name suffixes (``__<counter>``)."""
    import onnx

    def normalized(path):
        text = str(onnx.load(str(path)))
        return re.sub(r"__\d+", "__N", text)
    return normalized(a) == normalized(b)


def files_under(folder):
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.is_file())


def run_both(source_path, tmp_path, argv, targets_of, optimize_options):
    """The CLI with ``argv`` (``{out}`` → its folder), then the API with the same options
    (``targets_of(folder)``): both folders, the CLI's JSON report and the API's Written."""
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    cli_out.mkdir()
    api_out.mkdir()
    report = tmp_path / "report.json"
    code = main([str(source_path)] + [a.format(out=cli_out) for a in argv] +
                ["--report-json", str(report), "-q"])
    assert code == 0
    source = api.load(source_path)
    result = api.optimize(source, **optimize_options)
    written = api.write(source, result, targets_of(api_out))
    return cli_out, api_out, json.loads(report.read_text()), written


def assert_same_artefacts(cli_out, api_out, data, written):
    assert files_under(cli_out) == files_under(api_out)
    assert comparable(data["artefacts"], cli_out) == comparable(
        written.report()["artefacts"], api_out)
    assert all(entry["written"] for entry in data["artefacts"])
    assert written.published and all(a.written for a in written.artefacts)
    for entry, artefact in zip(data["artefacts"], written.artefacts):
        assert abs(entry["bytes"] - artefact.bytes) <= 16


@pytest.fixture
def pb(article, tmp_path):
    path = tmp_path / "article.pb"
    path.write_bytes(article.graph_def.SerializeToString())
    return path


def test_pb_only(pb, tmp_path, article):
    cli_out, api_out, data, written = run_both(
        pb, tmp_path, ["--bn-fold", "-o", "{out}/m.pb"],
        lambda out: api.Targets(pb=out / "m.pb"),
        dict(transforms=api.choose_transforms(bn_fold=True)))
    assert_same_artefacts(cli_out, api_out, data, written)
    assert (cli_out / "m.pb").read_bytes() == (api_out / "m.pb").read_bytes()
    assert [a.format for a in written.artefacts] == ["pb"]
    # the test's own oracle: the written graph computes what the original computes
    written_graph = tf.compat.v1.GraphDef.FromString((api_out / "m.pb").read_bytes())
    x = np.random.default_rng(3).standard_normal((2, 16, 16, 3)).astype(np.float32)
    feeds = {f"{article.inputs[0]}:0": x}
    out = f"{article.outputs[0]}:0"
    np.testing.assert_allclose(tf_run(written_graph, feeds, out),
                               tf_run(article.graph_def, feeds, out), rtol=1e-4, atol=1e-4)


def test_pb_and_onnx(pb, tmp_path, article):
    cli_out, api_out, data, written = run_both(
        pb, tmp_path, ["--bn-fold", "-o", "{out}/m.pb", "--onnx", "{out}/m.onnx"],
        lambda out: api.Targets(pb=out / "m.pb", onnx=out / "m.onnx"),
        dict(transforms=api.choose_transforms(bn_fold=True)))
    assert_same_artefacts(cli_out, api_out, data, written)
    assert (cli_out / "m.pb").read_bytes() == (api_out / "m.pb").read_bytes()
    assert same_onnx(cli_out / "m.onnx", api_out / "m.onnx")
    assert [a.format for a in written.artefacts] == ["pb", "onnx"]
    assert comparable(data["onnx"], cli_out) == comparable(written.report()["onnx"], api_out)
    # onnxruntime against the original in TensorFlow
    x = np.random.default_rng(4).standard_normal((2, 16, 16, 3)).astype(np.float32)
    session = ort.InferenceSession(str(api_out / "m.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    want = tf_run(article.graph_def, {f"{article.inputs[0]}:0": x}, f"{article.outputs[0]}:0")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_saved_model_and_tflite(pb, tmp_path):
    cli_out, api_out, data, written = run_both(
        pb, tmp_path, ["--bn-fold", "-o", "{out}/m.pb", "--saved-model", "{out}/sm",
                       "--tflite", "{out}/m.tflite"],
        lambda out: api.Targets(pb=out / "m.pb", saved_model=out / "sm",
                                tflite=out / "m.tflite"),
        dict(transforms=api.choose_transforms(bn_fold=True)))
    assert_same_artefacts(cli_out, api_out, data, written)
    assert [a.format for a in written.artefacts] == ["pb", "saved_model", "tflite"]
    assert [a.format for a in written.checks] == ["saved_model", "tflite"]
    for name in ("m.pb", "m.tflite"):
        assert (cli_out / name).read_bytes() == (api_out / name).read_bytes(), name


def test_float16_weights(pb, tmp_path):
    cli_out, api_out, data, written = run_both(
        pb, tmp_path, ["--bn-fold", "--store-weights", "float16", "-o", "{out}/m.pb", "--onnx",
                       "{out}/m.onnx", "--tflite", "{out}/m.tflite"],
        lambda out: api.Targets(pb=out / "m.pb", onnx=out / "m.onnx", tflite=out / "m.tflite"),
        dict(transforms=api.choose_transforms(bn_fold=True), weights="float16"))
    assert_same_artefacts(cli_out, api_out, data, written)
    assert {a.weights for a in written.artefacts} == {"float16"}
    for name in ("m.pb", "m.tflite"):
        assert (cli_out / name).read_bytes() == (api_out / name).read_bytes(), name
    assert same_onnx(cli_out / "m.onnx", api_out / "m.onnx")


def test_int8_onnx_on_digits(tmp_path):
    from int8_digits import CALIBRATE, TRAIN, digits_on_disk
    pb, images, _, graph_def = digits_on_disk(tmp_path)
    samples = tmp_path / "calibration.npz"
    cheap = ["--int8-calibration", "minmax", "--int8-equalize", "off",
             "--int8-bias-correction", "off", "--int8-min-agreement", "0.95"]
    cli_out, api_out, data, written = run_both(
        pb, tmp_path, ["-o", "{out}/m.pb", "--onnx", "{out}/m.onnx", "--quantize", "int8",
                       "--samples", str(samples)] + cheap,
        lambda out: api.Targets(pb=out / "m.pb", onnx=out / "m.onnx", int8=api.Int8Targets(
            samples=samples, calibration="minmax", equalize="off", bias_correction="off",
            thresholds=api.Int8Thresholds(given_agreement=0.95))),
        dict(samples=samples))
    assert_same_artefacts(cli_out, api_out, data, written)
    onnx_record = written.artefacts[1]
    assert onnx_record.format == "onnx" and onnx_record.weights == "int8"
    assert "160 gate rows" in onnx_record.checked_by
    assert data["int8"]["passed"] and written.int8.passed
    assert data["int8"]["outputs"] == written.report()["int8"]["outputs"]
    # the int8 model still classifies unseen digits like the float original
    unseen = images[TRAIN + CALIBRATE:][:200]
    session = ort.InferenceSession(str(api_out / "m.onnx"), providers=["CPUExecutionProvider"])
    got = np.concatenate([session.run(None, {session.get_inputs()[0].name: image[None]})[0]
                          for image in unseen])
    want = tf_run(graph_def, {"input:0": unseen}, "Identity:0")
    assert np.mean(got.argmax(1) == want.argmax(1)) > 0.95


def test_int8_without_an_int8_target_is_refused_before_any_work(pb, tmp_path):
    source = api.load(pb)
    result = api.optimize(source, api.choose_transforms(bn_fold=True))
    with pytest.raises(api.InputError, match="needs an ONNX, TFLite or OpenVINO output"):
        api.write(source, result, api.Targets(pb=tmp_path / "m.pb", int8=api.Int8Targets(
            samples=tmp_path / "rows.npz")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["article.pb"]


def test_a_plugin_that_moves_the_numbers_writes_nothing_either_way(pb, tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setattr(pipeline, "USER", {})
    plugin = tmp_path / "wrong.py"
    plugin.write_text(WRONG)
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    cli_out.mkdir()
    api_out.mkdir()
    report = tmp_path / "report.json"
    code = main([str(pb), "--plugin", str(plugin), "--transforms", "default,scale-a-weight",
                 "-o", str(cli_out / "m.pb"), "--onnx", str(cli_out / "m.onnx"),
                 "--tflite", str(cli_out / "m.tflite"), "--report-json", str(report), "-q"])
    assert code == 1 and "verification FAILED" in capsys.readouterr().err
    assert json.loads(report.read_text())["artefacts"] == []
    api.load_plugins([str(plugin)])
    source = api.load(pb)
    with pytest.raises(api.VerificationFailed) as failed:
        api.optimize(source, ["default", "scale-a-weight"])
    targets = api.Targets(pb=api_out / "m.pb", onnx=api_out / "m.onnx",
                          tflite=api_out / "m.tflite")
    with pytest.raises(api.Unverified):
        api.write(source, failed.value.result, targets)
    assert list(cli_out.iterdir()) == [] and list(api_out.iterdir()) == []


def test_a_failed_export_check_writes_nothing_either_way(pb, tmp_path, monkeypatch, capsys):
    """The ONNX check misses (onnxruntime's outputs scaled): the .pb and SavedModel, which
    passed, are not written either; the CLI's report and the API's WriteFailed say the same."""
    real = onnx_export.run_onnx
    monkeypatch.setattr(onnx_export, "run_onnx", lambda *a, **k: [x * 1.5 for x in real(*a, **k)])
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    cli_out.mkdir()
    api_out.mkdir()
    report = tmp_path / "report.json"
    code = main([str(pb), "--bn-fold", "-o", str(cli_out / "m.pb"), "--saved-model",
                 str(cli_out / "sm"), "--onnx", str(cli_out / "m.onnx"), "--report-json",
                 str(report), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("tfsurgery: ONNX check FAILED: onnxruntime differs")
    source = api.load(pb)
    result = api.optimize(source, api.choose_transforms(bn_fold=True))
    with pytest.raises(api.WriteFailed) as failed:
        api.write(source, result, api.Targets(pb=api_out / "m.pb", saved_model=api_out / "sm",
                                              onnx=api_out / "m.onnx"))
    assert failed.value.stage == "ONNX check"
    assert err == f"tfsurgery: ONNX check FAILED: {failed.value}; nothing written"
    assert list(cli_out.iterdir()) == [] and list(api_out.iterdir()) == []
    data, records = json.loads(report.read_text()), failed.value.written.report()
    assert data["artefacts"] == records["artefacts"] == []
    assert data["onnx"]["passed"] is False and records["onnx"]["passed"] is False
    assert data["onnx"]["max_error"] == pytest.approx(records["onnx"]["max_error"])


def test_the_cli_holds_no_export_sequence_of_its_own():
    """The CLI imports only the API (test_architecture) and calls api.write: it neither batches
    nor calls an exporter itself (only `inspect --picture` draws its one picture)."""
    text = "".join(path.read_text() for path in (ROOT / "tfsurgery" / "cli").glob("*.py"))
    assert "api.write(" in text
    assert not re.search(r"api\.(Batch|export_onnx|export_int8|export_saved_model|"
                         r"export_tflite|export_tflite_int8|save)\(", text)


def test_the_readme_example_writes_together(tmp_path, monkeypatch):
    """The README's api.write example, as written there."""
    from docs_examples import marked_example
    code = marked_example("<!-- write-example")[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["article_cnn.onnx", "article_cnn.pb"]
