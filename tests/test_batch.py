"""``tfsurgery batch`` / ``tfsurgery.batch.run`` (issue 33, item 4): a folder of models, each in its
own process, failures isolated, a summary, re-runs that skip what is up to date — checked with the
tests' own oracle (plain TF sessions, the SavedModel loaded by TF itself)."""
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import oracle
from tfsurgery import batch
from tfsurgery.cli import main, parse_args
from tfsurgery.errors import InputError
from tfsurgery.models import tf1


def _keras2_h5(path):
    """A Keras-2 (tf_keras) model with BN and dropout, random weights and statistics."""
    import tf_keras
    r = np.random.default_rng(31)
    model = tf_keras.Sequential([tf_keras.Input((6,), name="features"),
                                 tf_keras.layers.Dense(8, name="dense"),
                                 tf_keras.layers.BatchNormalization(name="bn"),
                                 tf_keras.layers.Dropout(0.3),
                                 tf_keras.layers.Dense(3, name="head")])
    for weight in model.weights:
        weight.assign(r.uniform(0.5, 1.5, weight.shape).astype("float32"))
    model.save(path)


class Scorer(tf.Module):
    def __init__(self, r):
        self.w = tf.Variable(r.normal(0, 0.5, (5, 4)).astype(np.float32))
        self.b = tf.Variable(r.normal(0, 0.5, (4,)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.float32, name="x")])
    def __call__(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.w) + self.b) * 2.0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Five models: the demo (.pb), a Keras-2 .h5, a SavedModel folder, a .pbtxt and a broken
    file — plus a README, which is no model."""
    from google.protobuf import text_format
    folder = tmp_path_factory.mktemp("models")
    article = tf1.article_cnn(seed=7)
    (folder / "article.pb").write_bytes(article.graph_def.SerializeToString())
    conv = tf1.conv_bn(seed=3)
    (folder / "conv.pbtxt").write_text(text_format.MessageToString(conv.graph_def))
    _keras2_h5(folder / "keras2.h5")
    scorer = Scorer(np.random.default_rng(13))
    tf.saved_model.save(scorer, str(folder / "scorer"), signatures={"serving_default":
                                                                    scorer.__call__})
    (folder / "broken.pb").write_bytes(b"this is not a GraphDef \x00\xff\x13")
    (folder / "README.txt").write_text("not a model")
    return folder, {"article.pb": article, "conv.pbtxt": conv}


def _by_model(summary):
    return {record["model"]: record for record in summary["models"]}


def _optimized_graph(out, record):
    path = next(out / a["path"] for a in record["artefacts"] if a["format"] == "pb")
    graph_def = tf.compat.v1.GraphDef()
    if path.suffix == ".pbtxt":
        from google.protobuf import text_format
        text_format.Parse(path.read_text(), graph_def)
    else:
        graph_def.ParseFromString(path.read_bytes())
    return graph_def


def test_a_folder_of_five_models_two_at_a_time(model_dir, tmp_path, capsys):
    folder, built = model_dir
    out = tmp_path / "out"
    done = []
    started = time.monotonic()
    summary = batch.run(folder, out, ["--bn-fold"], jobs=2, on_done=done.append)
    first_seconds = time.monotonic() - started
    records = _by_model(summary)
    assert sorted(records) == ["article.pb", "broken.pb", "conv.pbtxt", "keras2.h5", "scorer"]
    assert len(done) == 5                        # README.txt is no model
    statuses = {name: r["status"] for name, r in records.items()}
    assert statuses == {"article.pb": "ok", "conv.pbtxt": "ok", "keras2.h5": "ok",
                        "scorer": "ok", "broken.pb": "error"}, records
    assert batch.exit_status(summary) == 1 and summary["counts"] == {"error": 1, "ok": 4}
    broken = records["broken.pb"]
    assert "broken.pb" in broken["error"] and broken["artefacts"] == []
    assert not (out / "broken").exists()         # a failed model leaves nothing behind
    assert json.loads((out / "summary.json").read_text()) == summary
    assert not (out / batch.WORK).exists()

    for name, record in records.items():
        if record["status"] != "ok":
            continue
        graph_def = _optimized_graph(out, record)
        assert record["nodes_after"] == len(graph_def.node) < record["nodes_before"]
        assert record["max_error"] <= record["tolerance"] == 1e-4
        assert (out / record["output_dir"] / "report.json").exists()

    # the oracle: each original and its optimized graph in plain TF sessions
    for name in ("article.pb", "conv.pbtxt"):
        model = built[name]
        flags = {model.training_flag: False} if model.training_flag else {}
        oracle.assert_same_outputs(model.graph_def, _optimized_graph(out, records[name]),
                                   model.inputs, model.outputs, original_feeds=flags,
                                   rtol=1e-5)
    # the SavedModel as TF itself loads and runs it, against the optimized frozen graph
    report = json.loads((out / "scorer" / "report.json").read_text())
    x = np.random.default_rng(3).normal(size=(3, 5)).astype(np.float32)
    expected = tf.saved_model.load(str(folder / "scorer")).signatures["serving_default"](
        x=tf.constant(x))["y"].numpy()
    actual, = oracle.run(_optimized_graph(out, records["scorer"]), {report["inputs"][0]: x},
                         report["outputs"][:1])
    assert oracle.relative_error(expected, actual) <= 1e-5

    # a second run skips what is up to date (a changed input: see the next test); the broken
    # model, which has no outputs, is tried again
    # (through the command line: the same options, the table printed, exit status 1)
    code = main(["batch", str(folder), "--bn-fold", "-o", str(out), "--jobs", "2"])
    printed = capsys.readouterr().out
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    statuses = {name: r["status"] for name, r in _by_model(summary).items()}
    assert statuses == {"article.pb": "skipped", "keras2.h5": "skipped", "scorer": "skipped",
                        "conv.pbtxt": "skipped", "broken.pb": "error"}
    assert summary["options"] == ["--bn-fold"]
    row = next(line for line in printed.splitlines() if "article.pb" in line and "|" in line)
    assert "skipped" in row and f"150 → {records['article.pb']['nodes_after']}" in row
    assert "4 skipped" in printed and "1 error" in printed
    assert _by_model(summary)["article.pb"]["nodes_after"] == records["article.pb"]["nodes_after"]
    with capsys.disabled():              # the cost, for `pytest -s` (docs/batch.md)
        print(f"\nfirst run (5 models, --jobs 2): {first_seconds:.1f} s (" + ", ".join(
            f"{name} {r['seconds']:.1f} s" for name, r in records.items()) +
            f"); second: {summary['seconds']:.1f} s")


def test_up_to_date_needs_the_same_options_and_newer_outputs(model_dir, tmp_path):
    """The stamp rule on its own, without running a model: same fingerprint, every output
    present and newer than the model and the files the options name."""
    folder, _ = model_dir
    model = tmp_path / "article.pb"
    model.write_bytes((folder / "article.pb").read_bytes())
    out = tmp_path / "article"
    out.mkdir()
    (out / "article_optimized.pb").write_bytes(b"x")
    fingerprint = batch.options_fingerprint(["--bn-fold"], [])
    record = {"artefacts": [{"format": "pb", "path": "article/article_optimized.pb"}]}
    (out / batch.STAMP).write_text(json.dumps({"fingerprint": fingerprint, "record": record}))
    assert batch.up_to_date(model, out, fingerprint) == record
    assert batch.up_to_date(model, out, batch.options_fingerprint([], [])) is None
    assert batch.up_to_date(model, out, batch.options_fingerprint(["--bn-fold"], ["onnx"])) \
        is None
    samples = tmp_path / "samples.npz"
    samples.write_bytes(b"newer")
    later = time.time() + 5
    os.utime(samples, (later, later))            # a file the options name changed since
    assert batch.up_to_date(model, out, fingerprint, ["--samples", str(samples)]) is None
    os.utime(samples, (0, 0))
    assert batch.up_to_date(model, out, fingerprint, ["--samples", str(samples)]) == record
    os.utime(model, (later, later))              # the model changed since
    assert batch.up_to_date(model, out, fingerprint) is None
    os.utime(model, (0, 0))
    (out / "article_optimized.pb").unlink()
    assert batch.up_to_date(model, out, fingerprint) is None


def test_a_model_past_its_deadline_is_killed_and_reported(model_dir, tmp_path):
    folder, _ = model_dir
    single = tmp_path / "in"
    single.mkdir()
    (single / "article.pb").write_bytes((folder / "article.pb").read_bytes())
    started = time.monotonic()
    summary = batch.run(single, tmp_path / "out", timeout=0.5)
    record, = summary["models"]
    assert record["status"] == "timeout" and "deadline" in record["error"]
    assert time.monotonic() - started < 30
    assert batch.exit_status(summary) == 1


WRONG_PLUGIN = '''
import tfsurgery

@tfsurgery.transform("scale-a-weight")
def scale_a_weight(graph, options):
    """Multiplies the first conv kernel by 1.1: the numbers move."""
    report = tfsurgery.TransformReport("scale-a-weight")
    conv = graph.nodes_with_ops({"Conv2D"})[0]
    kernel = graph.inputs(conv.name)[1]
    graph.set_input(conv.name, 1, graph.add_const("scaled", graph.const_value(kernel) * 1.1))
    report.rewritten.append(conv.name)
    return report
'''


def test_a_model_failing_verification_is_reported_and_its_old_outputs_go(model_dir, tmp_path):
    """Exit status 1, the verifier's numbers in the record, nothing published — and the
    outputs an earlier batch left for this model (other options) are removed as stale."""
    folder, _ = model_dir
    single = tmp_path / "in"
    single.mkdir()
    (single / "article.pb").write_bytes((folder / "article.pb").read_bytes())
    plugin = tmp_path / "wrong.py"
    plugin.write_text(WRONG_PLUGIN)
    out = tmp_path / "out"
    earlier = out / "article"
    earlier.mkdir(parents=True)
    (earlier / "article_optimized.pb").write_bytes(b"from an earlier run")
    (earlier / batch.STAMP).write_text(json.dumps({"fingerprint": "other", "record": {}}))
    summary = batch.run(single, out, ["--plugin", str(plugin), "--transforms",
                                      "default,scale-a-weight"])
    record, = summary["models"]
    assert record["status"] == "failed" and "verification FAILED" in record["error"]
    assert record["max_error"] > record["tolerance"] and record["artefacts"] == []
    assert batch.exit_status(summary) == 1
    assert not earlier.exists()
    assert "verification FAILED" in (out / record["log"]).read_text()


@pytest.mark.parametrize("arguments, message", [
    (dict(options=["--onnx", "x.onnx"]), "--onnx: batch names each model's outputs"),
    (dict(options=["--report-json=r.json"]), "--report-json"),
    (dict(jobs=0), "jobs must be a positive"),
    (dict(exports=["coreml"]), "unknown export"),
    (dict(engine="slurm"), "unknown engine"),
])
def test_bad_requests_are_one_line_input_errors(model_dir, tmp_path, arguments, message):
    folder, _ = model_dir
    with pytest.raises(InputError, match=message):
        batch.run(folder, tmp_path / "out", **arguments)
    assert not (tmp_path / "out").exists()


def test_an_empty_folder_and_the_input_as_output_are_refused(tmp_path):
    with pytest.raises(InputError, match="no models"):
        batch.run(tmp_path, tmp_path / "out")
    with pytest.raises(InputError, match="must not be the input folder"):
        batch.run(tmp_path, tmp_path)
    with pytest.raises(InputError, match="not a directory"):
        batch.run(tmp_path / "missing", tmp_path / "out")


@pytest.mark.skipif(not batch.ray_available(), reason="Ray is not installed (pip install ray)")
def test_the_same_jobs_on_a_local_ray_instance(model_dir, tmp_path):
    folder, built = model_dir
    single = tmp_path / "in"
    single.mkdir()
    for name in ("article.pb", "broken.pb"):
        (single / name).write_bytes((folder / name).read_bytes())
    code = main(["batch", str(single), "-o", str(tmp_path / "out"), "--jobs", "2",
                 "--engine", "ray", "--bn-fold", "--model-timeout", "300"])
    assert code == 1                                  # the broken one
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["engine"] == "ray" and summary["timeout"] == 300
    records = _by_model(summary)
    assert {name: r["status"] for name, r in records.items()} == {"article.pb": "ok",
                                                                  "broken.pb": "error"}
    model = built["article.pb"]
    oracle.assert_same_outputs(model.graph_def,
                               _optimized_graph(tmp_path / "out", records["article.pb"]),
                               model.inputs, model.outputs,
                               original_feeds={model.training_flag: False}, rtol=1e-5)


@pytest.mark.skipif(not batch.ray_available(), reason="Ray is not installed (pip install ray)")
def test_with_a_cluster_address_the_outputs_travel_back_to_the_driver(model_dir, tmp_path):
    """Issue 41 item 4: with ``ray_address`` the jobs run in staging folders of the nodes' own;
    each passed model's outputs and every log come back inside its record and are published
    here — OUT_DIR holds what the summary calls ok, checked by the oracle. (A local instance
    reached by its address: the path a cluster takes.)"""
    import ray
    folder, built = model_dir
    single = tmp_path / "in"
    single.mkdir()
    for name in ("article.pb", "broken.pb"):
        (single / name).write_bytes((folder / name).read_bytes())
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": batch._PACKAGE_ROOT}})
    try:
        address = ray.get_runtime_context().gcs_address
        summary = batch.run(single, tmp_path / "out", ["--bn-fold"], jobs=2, engine="ray",
                            ray_address=address, timeout=300)
    finally:
        ray.shutdown()
    records = _by_model(summary)
    assert {name: r["status"] for name, r in records.items()} == {"article.pb": "ok",
                                                                  "broken.pb": "error"}
    assert all(r["received_bytes"] > 0 for r in records.values())     # they travelled
    for record in records.values():
        assert (tmp_path / "out" / record["log"]).read_text().strip()
    ok = records["article.pb"]
    assert {a["format"] for a in ok["artefacts"]} == {"pb"}
    assert all((tmp_path / "out" / a["path"]).is_file() for a in ok["artefacts"])
    report = json.loads((tmp_path / "out" / "article" / "report.json").read_text())
    assert str(tmp_path / "out" / "article") in json.dumps(report)     # paths as published
    assert not (tmp_path / "out" / "broken").exists()
    model = built["article.pb"]
    oracle.assert_same_outputs(model.graph_def, _optimized_graph(tmp_path / "out", ok),
                               model.inputs, model.outputs,
                               original_feeds={model.training_flag: False}, rtol=1e-5)


# ---------------------------------------------------------------- the command line
def test_the_optimize_options_batch_passes_on():
    """batch's own options anywhere; the rest must parse as optimize options, and each model's
    run gets them in the order given, without IN_DIR — also where an option's value is the
    same word as IN_DIR."""
    args = parse_args(["batch", "--tolerance", "1e-3", "models", "-o", "out", "--jobs", "2",
                       "--onnx", "--samples", "models", "-q"])
    assert (args.optimize.input, args.output, args.jobs, args.onnx, args.tflite) == \
        ("models", "out", 2, True, False)
    assert args.optimize_argv == ["--tolerance", "1e-3", "--samples", "models", "-q"]
    assert args.quiet and args.optimize.tolerance == 1e-3 and args.optimize.samples == "models"
    args = parse_args(["batch", "--samples", "models", "models", "-o", "out"])
    assert args.optimize_argv == ["--samples", "models"] and args.optimize.input == "models"


@pytest.mark.parametrize("argv, message", [
    (["-o", "OUT"], "the folder of models (IN_DIR) is missing"),
    (["IN"], "the following arguments are required: -o/--output"),
    (["IN", "-o", "OUT", "--tolerance", "nope"], "batch: argument --tolerance"),
    (["IN", "-o", "OUT", "--onnx", "x.onnx"], "unrecognized arguments: x.onnx"),
    (["IN", "-o", "OUT", "--jobs", "0"], "--jobs: must be a whole number"),
    (["IN", "-o", "OUT", "--report-json", "r.json"], "batch names each model's outputs itself"),
    (["IN", "-o", "OUT", "--transforms", "nobody-knows"], "unknown transform 'nobody-knows'"),
    (["IN", "-o", "OUT", "--list-transforms"], "optimizes nothing"),
    (["IN/article.pb", "-o", "OUT"], "not a directory"),
    (["IN", "-o", "OUT", "--ray-shared-output"], "it needs --engine ray --ray-address"),
])
def test_bad_batch_usage_is_one_line_and_exit_2(model_dir, tmp_path, capsys, argv, message):
    folder, _ = model_dir
    out = tmp_path / "out"
    words = {"OUT": str(out), "IN": str(folder), "IN/article.pb": str(folder / "article.pb")}
    code = main(["batch", *[words.get(word, word) for word in argv]])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_engine_ray_without_ray_says_how_to_get_it(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(batch, "ray_available", lambda: False)      # as if Ray were missing
    folder, _ = model_dir
    code = main(["batch", str(folder), "-o", str(tmp_path / "out"), "--engine", "ray"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "pip install ray" in err and len(err.splitlines()) == 1


def test_each_models_words_are_optimize_options_with_paths_in_its_own_folder(tmp_path):
    """Every export's option points inside the model's staging folder, and the words parse
    as `optimize` options (the grammar each model's process uses)."""
    from tfsurgery.cli.parser import build_parser
    model = tmp_path / "m.pbtxt"
    model.write_text("")
    job = batch._job(model, "m", tmp_path / "out", ["--bn-fold"], batch.EXPORTS, 60.0, "f")
    args = build_parser().parse_args(["optimize", job["model"], *job["argv"]])
    stage = job["stage"]
    for path in (args.output, args.report_json, args.onnx, args.tflite, args.saved_model,
                 args.openvino, args.picture):
        assert path.startswith(stage + os.sep), path
    assert args.bn_fold and args.output.endswith("m_optimized.pbtxt")


def _fake_job(tmp_path, name, main_code):
    """A job whose `python -m tfsurgery` is a stand-in package in its cwd (first on sys.path)
    running ``main_code``: the job machinery without starting TensorFlow."""
    cwd = tmp_path / f"cwd_{name}"
    (cwd / "tfsurgery").mkdir(parents=True)
    (cwd / "tfsurgery" / "__init__.py").write_text("")
    (cwd / "tfsurgery" / "__main__.py").write_text(main_code)
    out = tmp_path / "out"
    job = batch._job(tmp_path / f"{name}.pb", name, out, [], [], 120.0, "f")
    job.update(cwd=str(cwd), env={"PATH": os.environ.get("PATH", "")})
    return job


def test_an_error_of_ours_in_one_job_is_that_models_record(tmp_path):
    job = _fake_job(tmp_path, "m", "")
    job["cwd"] = str(tmp_path / "gone")                 # Popen itself fails
    record = batch.run_job(job)
    assert record["status"] == "error" and "FileNotFoundError" in record["error"]
    assert not os.path.exists(job["stage"])


def test_an_interrupted_batch_kills_its_model_processes(tmp_path):
    """Model processes live in sessions of their own (a deadline kills one group), so the
    terminal's Ctrl-C never reaches them: the batch kills them itself. No timing assumed
    (issue 47: this failed once under load): Ctrl-C comes once both processes are observed
    running AND registered with the batch (what it kills), and each must then be observed
    dead — killed, not ending on its own: they sleep 600 s — within margins that hold on a
    loaded 2-core machine."""
    import signal
    import threading
    sleeper = ("import os, sys, time\n"
               "open(os.path.join(os.getcwd(), 'pid'), 'w').write(str(os.getpid()))\n"
               "time.sleep(600)\n")
    jobs = [dict(_fake_job(tmp_path, name, sleeper), timeout=3600) for name in ("a", "b")]
    pid_files = [Path(job["cwd"]) / "pid" for job in jobs]     # (no deadline kills them)

    def registered() -> set:
        with batch._RUNNING_LOCK:
            return {process.pid for process in batch._RUNNING}

    def running() -> bool:                           # both started and both the batch's
        return all(p.exists() and p.read_text() for p in pid_files) and \
            {int(p.read_text()) for p in pid_files} <= registered()

    def interrupt_once_both_run():
        wait_for(running, 300)
        os.kill(os.getpid(), signal.SIGINT)         # what Ctrl-C sends

    threading.Thread(target=interrupt_once_both_run, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        list(batch._run_locally(jobs, 2))
    pids = [int(p.read_text()) for p in pid_files]
    wait_for(lambda: not any(_alive(pid) for pid in pids), 60)
    assert not any(_alive(pid) for pid in pids)


def wait_for(condition, seconds: float) -> None:
    """Until ``condition()`` holds (an AssertionError after ``seconds``: a margin, not a
    timing the test relies on)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Is ``pid`` running (a zombie — killed, not yet reaped — is not)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_chatter_does_not_change_the_fingerprint():
    assert batch.options_fingerprint(["--bn-fold", "-q"], []) == \
        batch.options_fingerprint(["--bn-fold"], []) != batch.options_fingerprint([], [])


# ---------------------------------------------------------------- what the fingerprint covers
PROBE_PLUGIN = '''
import tfsurgery
from batch_probe_helper_{tag} import NOTE


@tfsurgery.transform("batch-probe-{tag}")
def batch_probe(graph, options):
    """Changes nothing; its note comes from a module of the user's it imports."""
    report = tfsurgery.TransformReport("batch-probe-{tag}")
    report.notes.append(NOTE)
    return report
'''


def _user_folder(tmp_path, monkeypatch, tag):
    """The current directory holding a plugin module that imports a helper module of its own
    (module names of their own per test: this process keeps what it imported), and a samples
    file: what the options below name."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"batch_probe_plugin_{tag}.py").write_text(PROBE_PLUGIN.format(tag=tag))
    (tmp_path / f"batch_probe_helper_{tag}.py").write_text("NOTE = 'first'\n")
    conv = tf1.conv_bn(seed=3, batch=None)
    np.savez(tmp_path / "samples.npz", **oracle.random_feeds(conv.graph_def, conv.inputs, 5))
    return conv


def _changed_in_place(path, text=None, data=None):
    """New content, the modification time set back to the epoch: only content can tell."""
    if text is not None:
        path.write_text(text)
    else:
        path.write_bytes(data)
    os.utime(path, (0, 0))


def test_the_fingerprint_covers_named_files_and_the_users_code(tmp_path, monkeypatch):
    """Issue 41 item 4: the content of every file an option names (``--samples=PATH`` too) and
    of every module ``--plugin`` loads — its own file and the user's module it imports."""
    _user_folder(tmp_path, monkeypatch, "a")
    for options in (["--samples=samples.npz", "--plugin", "batch_probe_plugin_a"],
                    ["--samples", "samples.npz", "--plugin=batch_probe_plugin_a"]):
        first = batch.options_fingerprint(options, [])
        assert batch.options_fingerprint(options, []) == first           # deterministic
        samples = (tmp_path / "samples.npz").read_bytes()
        _changed_in_place(tmp_path / "samples.npz", data=samples + b"\0")
        changed = batch.options_fingerprint(options, [])
        _changed_in_place(tmp_path / "samples.npz", data=samples)
        assert changed != first == batch.options_fingerprint(options, [])
        helper = tmp_path / "batch_probe_helper_a.py"
        _changed_in_place(helper, "NOTE = 'second'\n")
        assert batch.options_fingerprint(options, []) != first
        _changed_in_place(helper, "NOTE = 'first'\n")
        assert batch.options_fingerprint(options, []) == first
    assert batch.named_paths(["--samples=samples.npz", "--feed", "x=samples.npz", "1e-3"]) == \
        ["samples.npz"]
    with pytest.raises(InputError, match="--import no_such_module_here"):
        batch.options_fingerprint(["--import", "no_such_module_here"], [])


def test_batch_reruns_a_model_whose_samples_or_plugin_changed(tmp_path, monkeypatch):
    """Through the command line: a model is skipped while nothing changed, and optimized
    again when the --samples file's content or a module its plugin imports changed — even
    with their modification times set back; the outputs checked by the oracle."""
    conv = _user_folder(tmp_path, monkeypatch, "b")
    from google.protobuf import text_format
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "conv.pbtxt").write_text(text_format.MessageToString(conv.graph_def))
    argv = ["batch", "in", "-o", "out", "--bn-fold", "--samples=samples.npz",
            "--plugin", "batch_probe_plugin_b", "--transforms", "default,batch-probe-b"]

    def status():
        assert main(argv) == 0
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        record, = summary["models"]
        return record["status"], record

    assert status()[0] == "ok"
    assert status()[0] == "skipped"
    np.savez(tmp_path / "samples.npz", **oracle.random_feeds(conv.graph_def, conv.inputs, 6))
    os.utime(tmp_path / "samples.npz", (0, 0))
    assert status()[0] == "ok"
    _changed_in_place(tmp_path / "batch_probe_helper_b.py", "NOTE = 'second'\n")
    state, record = status()
    assert state == "ok"
    report = json.loads((tmp_path / "out" / "conv" / "report.json").read_text())
    assert "second" in json.dumps(report)                    # the changed helper ran
    assert status()[0] == "skipped"
    oracle.assert_same_outputs(conv.graph_def, _optimized_graph(tmp_path / "out", record),
                               conv.inputs, conv.outputs, rtol=1e-5)


def test_a_declared_shared_output_is_checked_from_the_driver(tmp_path):
    """``--ray-shared-output``: the nodes write to OUT_DIR themselves; a model whose outputs
    are not visible here (at their recorded size) is an error, never ok."""
    out = tmp_path / "out"
    (out / "article").mkdir(parents=True)
    (out / "article" / "article_optimized.pb").write_bytes(b"12345")
    record = {"model": "article.pb", "status": "ok", "error": None, "artefacts": [
        {"format": "pb", "path": "article/article_optimized.pb", "bytes": 5}]}
    assert batch.checked_visible(record, out) == record
    for artefact in ({"format": "pb", "path": "article/article_optimized.pb", "bytes": 9},
                     {"format": "onnx", "path": "article/article.onnx", "bytes": 5}):
        seen = batch.checked_visible(dict(record, artefacts=[artefact]), out)
        assert seen["status"] == "error" and seen["artefacts"] == []
        assert artefact["path"] in seen["error"] and "not shared" in seen["error"]
    failed = dict(record, status="failed", artefacts=[])
    assert batch.checked_visible(failed, out) == failed
