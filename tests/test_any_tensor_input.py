"""Any tensor can be an input, and inputs take the values users have: a keyword-spotting graph
in the shape of TensorFlow's speech_commands example (string WAV → DecodeWav → AudioSpectrogram →
Mfcc → a small conv/dense head) cut at the decoded samples; vector --feed values; a dequeue's
batch. Numbers checked by the tests' own oracle."""
import json

import numpy as np
import pytest
import tensorflow as tf

from tfsurgery.cli import main

import oracle

SAMPLES = 800


def keyword_spotting(seed: int = 0):
    """wav_data (string) → decoded_sample_data (DecodeWav) → spectrogram → MFCC → conv → dense →
    labels_softmax; randomised weights."""
    r = np.random.default_rng(seed)
    with tf.Graph().as_default() as graph:
        wav = tf.compat.v1.placeholder(tf.string, [], name="wav_data")
        audio, _ = tf.raw_ops.DecodeWav(contents=wav, desired_channels=1,
                                        desired_samples=SAMPLES, name="decoded_sample_data")
        spectrogram = tf.raw_ops.AudioSpectrogram(input=audio, window_size=128, stride=64,
                                                  magnitude_squared=True)
        mfcc = tf.raw_ops.Mfcc(spectrogram=spectrogram, sample_rate=tf.constant(16000),
                               dct_coefficient_count=10)
        x = tf.reshape(mfcc, [-1, 11, 10, 1])
        x = tf.nn.conv2d(x, tf.constant(r.standard_normal((3, 3, 1, 4)), tf.float32), 1, "SAME")
        x = tf.nn.relu(tf.nn.bias_add(x, tf.constant(r.standard_normal(4), tf.float32)))
        x = tf.reshape(x, [-1, 440])
        x = tf.matmul(x, tf.constant(r.standard_normal((440, 3)) * 0.01, tf.float32))
        tf.nn.softmax(x, name="labels_softmax")
    return graph.as_graph_def()


def wav_bytes(seed: int) -> bytes:
    samples = np.random.default_rng(seed).uniform(-1, 1, (SAMPLES, 1)).astype(np.float32)
    with tf.Graph().as_default():
        with tf.compat.v1.Session() as session:
            return session.run(tf.audio.encode_wav(samples, 16000))


@pytest.fixture(scope="module")
def kws(tmp_path_factory):
    path = tmp_path_factory.mktemp("kws") / "kws.pb"
    graph_def = keyword_spotting()
    path.write_bytes(graph_def.SerializeToString())
    return path, graph_def


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.err.strip()


def test_cut_at_the_decoded_samples_optimizes_and_verifies(kws, tmp_path, capsys):
    path, original = kws
    out, report = tmp_path / "lean.pb", tmp_path / "r.json"
    code, err = run_cli(capsys, path, "--bn-fold", "-o", out, "--inputs",
                        "decoded_sample_data:0", "--report-json", report)
    assert code == 0, err
    data = json.loads(report.read_text())
    assert data["verification"]["passed"] is True
    lean = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    placeholder = next(n for n in lean.node if n.name == "decoded_sample_data")
    assert placeholder.op == "Placeholder"                       # DecodeWav has no dtype attr:
    assert placeholder.attr["dtype"].type == tf.float32.as_datatype_enum   # from its OpDef
    assert [d.size for d in placeholder.attr["shape"].shape.dim] == [SAMPLES, 1]   # inferred
    assert not {"DecodeWav"} & {n.op for n in lean.node}
    # The oracle: the original fed real WAV bytes, the result fed what DecodeWav makes of them.
    for seed in (1, 2):
        data = wav_bytes(seed)
        audio, expected = oracle.run(original, {"wav_data": data},
                                     ["decoded_sample_data:0", "labels_softmax"])
        actual = oracle.run(lean, {"decoded_sample_data": audio}, ["labels_softmax"])[0]
        assert oracle.relative_error(expected, actual) < 1e-5


def test_onnx_refused_in_one_line_naming_the_ops(kws, tmp_path, capsys):
    path, _ = kws
    code, err = run_cli(capsys, path, "-o", tmp_path / "lean.pb", "--inputs",
                        "decoded_sample_data:0", "--onnx", tmp_path / "lean.onnx")
    assert code == 1 and len(err.splitlines()) == 1
    assert "AudioSpectrogram" in err and "Mfcc" in err
    assert list(tmp_path.iterdir()) == []


def test_a_string_input_says_what_to_feed(kws, tmp_path, capsys):
    path, original = kws
    code, err = run_cli(capsys, path, "-o", tmp_path / "lean.pb")
    assert code == 2 and len(err.splitlines()) == 1
    assert "'wav_data' is a string tensor" in err and "--feed wav_data=" in err
    assert "--input-shape" not in err and not (tmp_path / "lean.pb").exists()
    # ...and a real one fed as an .npy of bytes verifies the whole graph, decoder included.
    np.save(tmp_path / "wav.npy", np.asarray(wav_bytes(3)))
    code, err = run_cli(capsys, path, "-o", tmp_path / "lean.pb", "--feed",
                        f"wav_data={tmp_path / 'wav.npy'}")
    assert code == 0, err
    lean = tf.compat.v1.GraphDef.FromString((tmp_path / "lean.pb").read_bytes())
    oracle.assert_same_outputs(original, lean, ["wav_data"], ["labels_softmax"],
                               feeds={"wav_data": wav_bytes(4)})


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """scores [N, 3] above per-class thresholds (a 3-vector input, as a face detector has)."""
    r = np.random.default_rng(5)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="input")
        thresholds = tf.compat.v1.placeholder(tf.float32, [3], name="thresholds")
        scores = tf.nn.sigmoid(tf.matmul(tf.identity(x), tf.constant(r.standard_normal((4, 3)),
                                                                    tf.float32)))
        tf.multiply(scores, tf.cast(scores > thresholds, tf.float32), name="output")
    path = tmp_path_factory.mktemp("det") / "det.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    return path, graph.as_graph_def()


def test_a_vector_feed(detector, tmp_path, capsys):
    path, original = detector
    code, err = run_cli(capsys, path, "-o", tmp_path / "a.pb", "--feed", "thresholds=0.6,0.7,0.7",
                        "--report-json", tmp_path / "r.json")
    assert code == 0, err
    assert json.loads((tmp_path / "r.json").read_text())["verification"]["passed"] is True
    lean = tf.compat.v1.GraphDef.FromString((tmp_path / "a.pb").read_bytes())
    oracle.assert_same_outputs(original, lean, ["input"], ["output"],
                               feeds={**oracle.random_feeds(original, ["input"], 7),
                                      "thresholds": np.asarray([0.6, 0.7, 0.7], np.float32)})


@pytest.mark.parametrize("value, message", [("0.6,0.7", "shape [2] does not fit"),
                                            ("0.6,,0.7", "empty value"),
                                            ("0.6,x,0.7", "separated by commas")])
def test_a_bad_vector_feed_is_one_line(detector, tmp_path, capsys, value, message):
    path, _ = detector
    code, err = run_cli(capsys, path, "-o", tmp_path / "a.pb", "--feed", f"thresholds={value}")
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a.pb").exists()
