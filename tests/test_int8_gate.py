"""The int8 loop's honest gate: calibration, selection and gate rows disjoint, the gate's lower
confidence bound, labels, per-layer float fallback in ONNX and TFLite. Oracles of the tests' own:
scipy's binomial tail for the bound, TensorFlow sessions and onnxruntime/LiteRT runs for numbers,
the rows' own bytes for who saw what."""
import json

import numpy as np
import onnxruntime as ort
import pytest

import oracle
from int8_digits import TRAIN, digits, digits_on_disk
from tfsurgery.int8 import loop as int8_loop
from tfsurgery.int8.backends import onnx as quantize
from tfsurgery.int8.backends import tflite as quantize_tflite
from tfsurgery.export import savedmodel as savedmodel_export
from tfsurgery.cli import main
from tfsurgery.verify.samples import Samples


# ---------------------------------------------------------------- the bound
@pytest.mark.parametrize("agreeing,compared", [(12, 12), (50, 50), (95, 100), (397, 400),
                                               (1, 3), (0, 10)])
def test_lower_bound_is_the_one_sided_clopper_pearson_bound(agreeing, compared):
    """The bound p is where seeing ``agreeing`` or more of ``compared`` has probability 5%."""
    from scipy.stats import binom
    bound = int8_loop.lower_bound(agreeing, compared)
    if agreeing == 0:
        assert bound == 0.0
        return
    assert binom.sf(agreeing - 1, compared, bound) == pytest.approx(0.05, abs=1e-6)
    assert bound < agreeing / compared


def test_rows_needed_for_a_threshold():
    assert int8_loop.rows_needed(0.99) == 299          # 0.99^299 ≤ 0.05 < 0.99^298
    assert 0.99 ** 299 <= 0.05 < 0.99 ** 298
    assert int8_loop.lower_bound(12, 12) == pytest.approx(0.7791, abs=1e-4)   # the issue's case
    needed = int8_loop.rows_needed(0.99, 0.998)
    assert int8_loop.lower_bound(int(0.998 * needed), needed) >= 0.99
    assert int8_loop.lower_bound(int(0.998 * (needed - 1)), needed - 1) < 0.99
    assert int8_loop.rows_needed(0.99, 0.99) is None    # at the threshold no count shows it
    assert int8_loop.rows_needed(0.0) == 0


def test_the_three_sets_are_disjoint_and_cover_the_rows():
    values = np.arange(100, dtype=np.float32).reshape(100, 1)
    rows = int8_loop.split_rows(Samples({"x": values}, {"x": False}, "s",
                                        np.arange(100) % 7))
    sets = [set(part.arrays["x"].ravel()) for part in (rows.calibration, rows.selection,
                                                       rows.gate)]
    assert [len(s) for s in sets] == [40, 20, 40]
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    assert set().union(*sets) == set(range(100))
    for part in (rows.calibration, rows.selection, rows.gate):      # labels travel with rows
        assert np.array_equal(part.labels, part.arrays["x"].ravel().astype(int) % 7)


# ---------------------------------------------------------------- digits
@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits_gate")
    pb, images, labels, graph_def = digits_on_disk(folder)
    rows = ["--samples", str(folder / "calibration.npz")]     # real digits: a check that sees
    assert main(["export", str(pb), "-o", str(folder / "float.onnx"), "-q", *rows]) == 0
    last_relu = [n.name for n in graph_def.node if n.op == "Relu"][-1]
    assert main(["export", str(pb), "-o", str(folder / "relu.onnx"), "--outputs", last_relu,
                 "-q", *rows]) == 0
    return dict(pb=pb, graph_def=graph_def, onnx=folder / "float.onnx", folder=folder,
                relu_onnx=folder / "relu.onnx",
                images=images[TRAIN:], labels=labels[TRAIN:], last_relu=last_relu)


def rows_of(model, count=400, labels=False):
    return int8_loop.split_rows(Samples({"input": model["images"][:count]}, {"input": False},
                                        "digits", model["labels"][:count] if labels else None))


def reference(model, rows, output):
    """The float graph in TensorFlow on the selection and gate rows, [row][output]."""
    expected = {}
    for name in ("selection", "gate"):
        images = getattr(rows, name).arrays["input"]
        values = oracle.run(model["graph_def"], {"input": images}, [output])[0]
        expected[name] = [[values[i:i + 1]] for i in range(len(images))]
    return expected


class Recording(quantize.OnnxBackend):
    """The ONNX backend, recording the rows of every run and the calibration it was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.runs = []

    def run(self, model, rows):
        self.runs.append(rows.arrays["input"].copy())
        return super().run(model, rows)


def fingerprints(array):
    return {row.tobytes() for row in array}


def test_a_choice_never_sees_the_gate_rows(digits_model, tmp_path):
    """Every attempt, every sensitivity and every fallback step runs on selection rows only; the
    gate rows are run once, last, on the model already chosen; calibration rows are neither."""
    rows = rows_of(digits_model)
    expected = reference(digits_model, rows, digits_model["last_relu"])
    # 200 dB forces the fallback; one layer of two kept float at most (both float is exact)
    thresholds = int8_loop.Thresholds(given_sqnr_db=200.0, max_float_layers=1)
    backend = Recording({"plain": digits_model["relu_onnx"]}, rows.calibration, tmp_path,
                        methods=["MinMax", "Percentile"], corrections=[False, True])
    with pytest.raises(int8_loop.Int8Refused) as refused:
        int8_loop.run_loop(backend, [digits_model["last_relu"]], rows, expected, thresholds,
                           tmp_path / "out.onnx")
    report = refused.value.report
    gate, selection = fingerprints(rows.gate.arrays["input"]), \
        fingerprints(rows.selection.arrays["input"])
    calibration = fingerprints(rows.calibration.arrays["input"])
    *choosing, judging = backend.runs
    # static: 4 attempts, the best with each alternative weight setting, a sensitivity per
    # layer, one fallback step; then dynamic (static missed): one attempt, its alternatives,
    # its sensitivities, one fallback step — all on the selection rows
    others = len(backend.alternatives(int8_loop.Choice()))
    assert others >= 1                        # onnxruntime's default weights on every target
    assert len(choosing) == 4 + others + report.layers + 1 + 1 + others + report.layers + 1
    assert [m["mode"] for m in report.modes] == ["static", "mixed", "dynamic", "dynamic mixed"]
    for run in choosing:
        assert fingerprints(run) == selection
    assert fingerprints(judging) == gate
    assert backend.calibration is rows.calibration
    assert not (gate & selection) and not (gate & calibration) and not (selection & calibration)
    assert (report.calibration_rows, report.selection_rows, report.gate_rows) == (160, 80, 160)
    assert len(report.kept_float) == 1 and not (tmp_path / "out.onnx").exists()
    assert all(name in str(refused.value) for name in report.kept_float)


def test_choose_takes_no_gate_rows():
    """By construction: the choosing step has no parameter through which gate rows could come."""
    import inspect
    assert "gate" not in " ".join(inspect.signature(int8_loop.choose).parameters)


def test_a_layer_kept_float_really_runs_float_in_onnxruntime(digits_model, tmp_path):
    """onnxruntime's WeightBiasQuantization would quantize a float conv fed by a per-tensor
    DequantizeLinear (per tensor, at session load); keep_float's per-axis DequantizeLinear
    stops it. Oracle: the same model with that rewrite disabled in onnxruntime."""
    rows = rows_of(digits_model)
    layers = quantize.quantizable_layers(digits_model["onnx"])
    second = layers[1]                      # a conv whose input is the first conv's QDQ output
    out = tmp_path / "kept.onnx"
    quantize._quantize_static(digits_model["onnx"], out, rows.calibration, [second],
                              cache=tmp_path / "cache.json")
    images = rows.gate.arrays["input"][:, None]

    def scores(path, disabled=()):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"],
                                       disabled_optimizers=list(disabled))
        return np.concatenate([session.run(None, {"input:0": image})[0] for image in images])

    intended = scores(out, ["WeightBiasQuantization"])
    assert not np.allclose(scores(out), intended, atol=1e-6)    # the trap, as onnxruntime has it
    assert quantize.keep_float(out, [second]) == 1
    np.testing.assert_allclose(scores(out), intended, atol=1e-6)
    import onnx
    onnx.checker.check_model(onnx.load(str(out)))


# ---------------------------------------------------------------- TFLite per-layer fallback
def test_tflite_keeps_a_layer_float_by_denylisting_it(digits_model, tmp_path):
    """The TFLite backend's fallback: the denylisted conv computes in float (its op's output is
    float32), the rest stays int8; with nothing denylisted the model is what the converter
    makes. Oracle: LiteRT runs against TensorFlow's float graph."""
    rows = rows_of(digits_model)
    signature = savedmodel_export.Signature.of_graph(["input"], [digits_model["last_relu"]])
    backend = quantize_tflite.TfliteBackend({"plain": digits_model["graph_def"]}, signature,
                                            [digits_model["last_relu"]], rows.calibration,
                                            tmp_path)
    choice = backend.choices()[0]
    layers = backend.layers(choice)
    assert len(layers) == 2 and all("conv2d" in layer for layer in layers)
    plain, kept = backend.build(choice, []), backend.build(choice, [layers[1]])
    assert quantize_tflite.float_ops(plain) == []
    assert quantize_tflite.float_ops(kept) == ["CONV_2D"]
    images = rows.gate.arrays["input"]
    reference = oracle.run(digits_model["graph_def"], {"input": images},
                           [digits_model["last_relu"]])[0]

    def litert(model):
        from ai_edge_litert.interpreter import Interpreter
        interpreter = Interpreter(model_content=model)
        runner = interpreter.get_signature_runner()
        key = list(runner.get_output_details())[0]
        return np.concatenate([runner(input=image[None])[key] for image in images])

    def sqnr(got):
        return 20 * np.log10(np.linalg.norm(reference) / np.linalg.norm(got - reference))

    # the last conv kept float: the error of its int8 weights and int8 output are gone
    assert sqnr(litert(kept)) > sqnr(litert(plain)) + 1.0


def test_tflite_fallback_through_the_loop_names_the_layer(digits_model, tmp_path):
    """Through the loop: a threshold between plain int8 and one layer float is met by keeping
    the most sensitive layer float; the written model has that one float conv."""
    rows = rows_of(digits_model)
    output = digits_model["last_relu"]
    signature = savedmodel_export.Signature.of_graph(["input"], [output])
    expected = reference(digits_model, rows, output)

    def loop(threshold, path):
        return quantize_tflite.export({"plain": digits_model["graph_def"]}, signature, path,
                                      outputs=[output], rows=rows, expected=expected,
                                      thresholds=int8_loop.Thresholds(
                                          given_sqnr_db=threshold, max_float_layers=1))

    with pytest.raises(int8_loop.Int8Refused) as refused:
        loop(200.0, tmp_path / "never.tflite")
    report = refused.value.report
    assert report.format == "tflite" and len(report.kept_float) == 1
    assert report.kept_float[0] == max(report.sensitivities, key=report.sensitivities.get)
    plain, one_float = report.plain_outputs[0].value, report.selection_outputs[0].value
    assert one_float > plain + 1.0
    written = loop((plain + one_float) / 2, tmp_path / "kept.tflite")
    assert written.passed and written.kept_float == report.kept_float
    model = (tmp_path / "kept.tflite").read_bytes()
    assert quantize_tflite.float_ops(model) == ["CONV_2D"]


# ---------------------------------------------------------------- the float reference (#32.3)
@pytest.fixture(scope="module")
def switched_model(tmp_path_factory):
    """A TF1 CNN with a plain bool `is_training` placeholder (cond batch norm) and a plain
    `keep_prob` placeholder (dropout), random weights: neither has a default, so the original
    runs only when they are fed."""
    from models.common import rng
    from models.tf1 import _built, bn_under_cond, bn_variables, conv, dense, v1_graph
    from tensorflow import compat
    import tensorflow as tf_module
    r = rng(3)
    with v1_graph() as graph:
        x = compat.v1.placeholder(tf_module.float32, [None, 8, 8, 1], name="input")
        training = compat.v1.placeholder(tf_module.bool, [], name="is_training")
        keep_prob = compat.v1.placeholder(tf_module.float32, [], name="keep_prob")
        with compat.v1.variable_scope("conv"):
            x = conv(x, r, 8)
        with compat.v1.variable_scope("bn"):
            x = bn_under_cond(x, training, bn_variables(r, 8))
        x = tf_module.nn.relu(x)
        x = tf_module.nn.dropout(x, rate=1 - keep_prob)
        x = tf_module.reshape(x, [-1, 8 * 8 * 8])
        with compat.v1.variable_scope("dense"):
            dense(x, r, 10, gain=0.5)
        tf_module.identity(graph.get_tensor_by_name("dense/BiasAdd:0"), name="logits")
    built = _built(graph, outputs=("logits",))
    folder = tmp_path_factory.mktemp("switched")
    pb = folder / "switched.pb"
    pb.write_bytes(built.graph_def.SerializeToString())
    images = digits()[0]
    np.savez(folder / "samples.npz", input=images[:200])
    np.savez(folder / "gate.npz", input=images[200:300])
    return dict(pb=pb, graph_def=built.graph_def, folder=folder, gate=images[200:300])


@pytest.mark.parametrize("target", ["onnx", "tflite"])
def test_the_int8_reference_is_the_original_with_its_switches_set(switched_model, tmp_path,
                                                                   target):
    """The gate's float reference is the original fed is_training=False and keep_prob=1 (what
    verification feeds it), not the original fed only the rows (which cannot run). Oracle: a
    TensorFlow session of the original so fed, against the written int8 model in onnxruntime
    or LiteRT on the gate rows: the report's agreement and relative error are those."""
    out = tmp_path / ("m.onnx" if target == "onnx" else "m.tflite")
    report = tmp_path / "r.json"
    where = ["export", str(switched_model["pb"]), "-o", str(out)] if target == "onnx" else \
        ["optimize", str(switched_model["pb"]), "-o", str(tmp_path / "m.pb"), "--tflite",
         str(out)]
    code = main(where + ["--quantize", "int8",
                         "--int8-min-speedup", "0", "--samples",
                         str(switched_model["folder"] / "samples.npz"), "--check-samples",
                         str(switched_model["folder"] / "gate.npz"), "--int8-min-agreement",
                         "0", "--report-json", str(report), "-q"])
    assert code == 0
    data = json.loads(report.read_text())
    int8 = data["int8" if target == "onnx" else "tflite_int8"]
    gate = switched_model["gate"]
    reference = oracle.run(switched_model["graph_def"], {"input": gate, "is_training": False,
                                                         "keep_prob": 1.0}, ["logits"])[0]
    if target == "onnx":
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        got = np.concatenate([session.run(None, {session.get_inputs()[0].name: row[None]})[0]
                              for row in gate])
    else:
        from ai_edge_litert.interpreter import Interpreter
        runner = Interpreter(model_path=str(out)).get_signature_runner()
        key = list(runner.get_output_details())[0]
        got = np.concatenate([runner(input=row[None])[key] for row in gate])
    measured = int8["outputs"][0]
    relative = np.linalg.norm(got - reference) / np.linalg.norm(reference)
    assert measured["value"] == pytest.approx(np.mean(got.argmax(-1) == reference.argmax(-1)))
    assert measured["relative_error"] == pytest.approx(relative, rel=1e-3)
    assert relative < 0.1                    # int8 of the inference graph, not of a dropout draw


# ---------------------------------------------------------------- the retrained MobileNet
def corpus_graph(name):
    """A graph of the shared real-world corpus (never copied into the repo): $TFSURGERY_CORPUS,
    else ../shared/corpus beside the repository."""
    import os
    from pathlib import Path
    root = Path(os.environ.get("TFSURGERY_CORPUS") or
                Path(__file__).resolve().parent.parent.parent / "shared" / "corpus")
    path = root / name
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared real-world corpus is not on this machine "
                    "(set TFSURGERY_CORPUS to its folder)")
    return path


def photo_crops(count, seed, size=128):
    """Crops of scikit-learn's two bundled photographs at random places and scales, half of them
    mirrored, resized to the model's 128×128 and scaled as tensorflow-for-poets feeds MobileNet:
    (x - 128) / 128."""
    pytest.importorskip("PIL", reason="load_sample_images reads JPEGs with pillow")
    import tensorflow as tf
    from sklearn.datasets import load_sample_images
    rng = np.random.default_rng(seed)
    photos = load_sample_images().images
    crops = []
    for k in range(count):
        photo = photos[k % len(photos)]
        side = int(rng.integers(64, min(photo.shape[:2])))
        y = int(rng.integers(0, photo.shape[0] - side + 1))
        x = int(rng.integers(0, photo.shape[1] - side + 1))
        crop = photo[y:y + side, x:x + side].astype(np.float32)
        if rng.integers(2):
            crop = crop[:, ::-1]
        crops.append((tf.image.resize(crop, (size, size)).numpy() - 128.0) / 128.0)
    return np.stack(crops).astype(np.float32)


@pytest.mark.slow
def test_retrained_mobilenet_is_refused_with_its_layers_named(tmp_path, capsys):
    """The retrained MobileNet v1 0.25 of the corpus on 150 photo crops (calibration and
    selection) and 320 other crops as gate rows — enough to show 0.99 (299 would do, all
    agreeing). Its plain int8 agrees with float on ~85-93% of crops (the error is spread over
    every layer's activations: no two layers kept float lift it near 0.99; dynamic int8, per-
    tensor weights, far less), so it is refused: exit 1, nothing written, every mode tried and
    the layers kept float and their sensitivities named; the gate's
    bound is the one-sided Clopper-Pearson bound of what it counted (checked against scipy)."""
    from scipy.stats import binom
    pb = corpus_graph("poets_mobilenet025_retrained.pb")
    np.savez(tmp_path / "samples.npz", input=photo_crops(150, 1))
    np.savez(tmp_path / "gate.npz", input=photo_crops(320, 2))
    out, report = tmp_path / "mobilenet_int8.onnx", tmp_path / "report.json"
    code = main(["export", str(pb), "--bn-fold", "-o", str(out), "--quantize", "int8",
                 "--int8-min-speedup", "0",
                 "--samples", str(tmp_path / "samples.npz"), "--check-samples",
                 str(tmp_path / "gate.npz"), "--int8-calibration", "minmax",
                 "--int8-equalize", "off", "--report-json", str(report), "-q"])
    int8 = json.loads(report.read_text())["int8"]
    gate = int8["outputs"][0]
    assert (int8["calibration_rows"], int8["selection_rows"], int8["gate_rows"]) == \
        (120, 30, 320)
    assert gate["measure"] == "top1_agreement" and gate["compared"] == 320
    agreeing = round(gate["value"] * 320)
    assert binom.sf(agreeing - 1, 320, gate["lower_bound"]) == pytest.approx(0.05, abs=1e-6)
    if code == 0:                           # written: the bound reached 0.99 on unseen rows
        assert gate["lower_bound"] >= 0.99 and out.exists()
        return
    assert code == 1 and not out.exists() and not int8["passed"]
    assert gate["lower_bound"] < 0.99
    ranked = sorted(int8["sensitivities"], key=int8["sensitivities"].get, reverse=True)
    assert len(ranked) == int8["layers"] == 29                # 27 convs, the logits, the head
    assert int8["max_float_layers"] == 2
    assert int8["kept_float"] in (ranked[:1], ranked[:2], [])   # the best fallback step
    named = int8["kept_float"] or ranked[:5]
    message = capsys.readouterr().err
    assert "int8 FAILED" in message and all(layer in message for layer in named)
    for layer in named:                      # tf2onnx's made-up names say what they feed
        if "Conv__" in layer:
            assert int8["layer_labels"][layer].startswith("before MobilenetV1/")
            assert int8["layer_labels"][layer] in message
    # every mode tried is named: static and mixed (MinMax, as asked), dynamic and its own mixed
    assert {a["method"] for a in int8["tried"]} == {"MinMax", "dynamic"}
    assert {m["mode"] for m in int8["modes"]} >= {"static", "dynamic"}
    assert all(f"{m['mode']} (" in message for m in int8["modes"])
