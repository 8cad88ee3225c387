"""Many models in one go: every model in a folder optimized with the same options, N at once.

Each model runs as its own ``python -m tfsurgery optimize`` process: TensorFlow is not fork-safe,
a crash or a hang in one model cannot touch the others, and a deadline is a kill of that process
(group). The options are the ``optimize`` options, as on its command line; the files each model
writes go to ``OUT_DIR/<name>/``, first into a staging folder, moved into place only when the run
passed (a failed model leaves no outputs behind: ``OUT_DIR`` holds exactly the models the summary
calls ok). ``OUT_DIR/summary.json`` records every model; a stamp beside each model's outputs
(the options' fingerprint: their text, the content of the files they name and of the user's
code they load) lets a re-run skip models whose outputs are newer than their inputs.

``engine="ray"`` hands the same jobs to a Ray cluster (``ray.util.multiprocessing.Pool``): no
scheduler of our own. This module imports no TensorFlow, so a Ray worker stays light.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from tfsurgery.errors import InputError

log = logging.getLogger("tfsurgery")

MODEL_SUFFIXES = (".pb", ".pbtxt", ".keras", ".h5", ".hdf5")
EXPORTS = ("onnx", "tflite", "saved_model", "openvino", "picture")
ENGINES = ("local", "ray")
DEFAULT_TIMEOUT = 1800.0         # seconds per model: a Keras ResNet50 with int8 takes minutes
SUMMARY = "summary.json"
STAMP = ".batch-stamp.json"      # beside a model's outputs: the options they were made with
WORK = ".batch-work"             # staging folders, on OUT_DIR's filesystem (publishing = rename)
LOGS = "logs"
# options that name one output file: batch gives every model its own (see _paths)
PER_MODEL_OPTIONS = ("-o", "--output", "--report-json", "--onnx", "--tflite", "--saved-model",
                     "--openvino", "--picture")
RAY_MISSING = ("--engine ray needs Ray: pip install ray (or pip install -e '.[ray]'), "
               "or run without --engine ray")
OK_STATUSES = ("ok", "skipped")
CHATTER = ("-v", "--verbose", "-q", "--quiet")   # options that change no output
CODE_OPTIONS = ("--plugin", "--import")          # options naming the user's code to import
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)   # so children import this code


def find_models(in_dir, exclude: Optional[Path] = None) -> List[Path]:
    """The models directly in ``in_dir``: .pb/.pbtxt/.keras/.h5 files and SavedModel folders
    (a folder with saved_model.pb), by name; hidden entries and ``exclude`` left out."""
    found = []
    for entry in sorted(Path(in_dir).iterdir()):
        if entry.name.startswith(".") or (exclude is not None and _same(entry, exclude)):
            continue
        if entry.is_dir():
            if (entry / "saved_model.pb").exists() or (entry / "saved_model.pbtxt").exists():
                found.append(entry)
        elif entry.suffix.lower() in MODEL_SUFFIXES:
            found.append(entry)
    return found


def run(in_dir, out_dir, options: Sequence[str] = (), *, exports: Sequence[str] = (),
        jobs: int = 1, timeout: float = DEFAULT_TIMEOUT, engine: str = "local",
        ray_address: Optional[str] = None, shared_output: bool = False,
        on_done: Optional[Callable[[dict], None]] = None) -> dict:
    """Optimize every model of ``in_dir`` (see :func:`find_models`) into ``out_dir/<name>/``.

    ``options``: ``tfsurgery optimize`` options as on its command line (``["--bn-fold",
    "--tolerance", "1e-3"]``), the same for every model; ``exports``: also write these per model
    (``onnx``, ``tflite``, ``saved_model``, ``openvino``, ``picture``), each checked as
    ``optimize`` checks it;
    ``jobs`` models at once; ``timeout`` seconds per model (then it is killed and reported);
    ``engine="ray"``: on Ray (``ray_address``, else a local instance of ``jobs`` CPUs); with
    an address each node's outputs travel back here, unless ``shared_output`` declares OUT_DIR
    shared with the nodes (then they write there and each output is checked visible here).
    ``on_done(record)`` is called as each model finishes. Returns the summary also written to
    ``out_dir/summary.json``; bad arguments raise ``InputError`` before any model runs."""
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    options = [str(option) for option in options]
    _check_request(in_dir, out_dir, options, exports, jobs, timeout, engine)
    if shared_output and not (engine == "ray" and ray_address):
        raise InputError("--ray-shared-output declares OUT_DIR shared with a Ray cluster's "
                         "nodes: it needs --engine ray --ray-address ADDRESS")
    models = find_models(in_dir, exclude=out_dir)
    if not models:
        raise InputError(f"{in_dir}: no models (.pb, .pbtxt, .keras, .h5 or SavedModel "
                         "folders) in it")
    out_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = options_fingerprint(options, exports)
    started = time.monotonic()
    records: Dict[str, dict] = {}
    pending = []
    for model, name in zip(models, _output_names(models)):
        previous = up_to_date(model, out_dir / name, fingerprint, options)
        if previous is not None:
            records[model.name] = _report(on_done, {**previous, "status": "skipped",
                                                    "seconds": 0.0, "error": None})
        else:
            pending.append(_job(model, name, out_dir, options, exports, timeout, fingerprint,
                                ship=engine == "ray" and bool(ray_address)
                                and not shared_output))
    run_all = _run_on_ray if engine == "ray" else _run_locally
    by_name = {job["name"]: job for job in pending}
    for record in run_all(pending, jobs, ray_address):
        record = _received(by_name[record["output_dir"]], record)
        if shared_output:
            record = checked_visible(record, out_dir)
        records[record["model"]] = _report(on_done, record)
    summary = {"tfsurgery": _version(), "input_dir": str(in_dir), "output_dir": str(out_dir),
               "options": options, "exports": sorted(exports), "fingerprint": fingerprint,
               "engine": engine, "jobs": jobs, "timeout": timeout,
               "seconds": round(time.monotonic() - started, 3),
               "models": [records[model.name] for model in models]}
    summary["counts"] = {status: sum(r["status"] == status for r in summary["models"])
                         for status in sorted({r["status"] for r in summary["models"]})}
    summary["ok"] = all(r["status"] in OK_STATUSES for r in summary["models"])
    _write_json_atomically(out_dir / SUMMARY, summary)
    shutil.rmtree(out_dir / WORK, ignore_errors=True)
    return summary


def exit_status(summary: dict) -> int:
    """0 when every model is ok (or was already up to date), else 1."""
    return 0 if summary["ok"] else 1


def format_summary(summary: dict) -> str:
    """The summary as a table: model, status, nodes before → after, max error, seconds, and
    what was written or went wrong."""
    from tfsurgery.report import format_table
    rows = []
    for r in summary["models"]:
        nodes = (f"{r['nodes_before']} → {r['nodes_after']}"
                 if r.get("nodes_before") is not None and r.get("nodes_after") is not None
                 else "-")
        error = "-" if r.get("max_error") is None else f"{r['max_error']:.3g}"
        note = r["error"].replace("tfsurgery: ", "", 1) if r.get("error") else ", ".join(
            Path(a["path"]).name for a in r.get("artefacts", []))
        rows.append((r["model"], r["status"], nodes, error, f"{r['seconds']:.1f}",
                     note[:100]))
    counts = ", ".join(f"{n} {status}" for status, n in summary["counts"].items())
    return (format_table(rows, headers=("model", "status", "nodes", "max error", "s", "note"))
            + f"\n{len(summary['models'])} models: {counts}; "
              f"{Path(summary['output_dir']) / SUMMARY}")


def options_fingerprint(options: Sequence[str], exports: Sequence[str]) -> str:
    """What decides a model's outputs besides the model: the options (less -v/-q), the content
    of every file or folder they name (``--samples PATH``, ``--samples=PATH``, ``--feed
    x=a.npy``, ...), the source of the user's code ``--plugin``/``--import`` load (imported
    here, as the command line does), the exports asked for and this tfsurgery's version."""
    options = [option for option in options if option not in CHATTER]
    text = json.dumps({"options": options, "exports": sorted(exports),
                       "files": {path: _content_hash(Path(path))
                                 for path in named_paths(options)},
                       "code": {path: _content_hash(Path(path)) for path in _user_code(options)},
                       "tfsurgery": _version()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def named_paths(options: Sequence[str]) -> List[str]:
    """Every existing file or folder an option names: a word itself, or what follows an "="
    in it (``--samples=PATH``, ``--feed NAME=PATH``)."""
    words = [option[i + 1:] for option in options for i, c in enumerate(option) if c == "="]
    return sorted({word for word in [*options, *words] if word and os.path.exists(word)})


def _user_code(options: Sequence[str]) -> List[str]:
    """The source files the ``--plugin`` and ``--import`` options load (their modules and the
    user's modules they import). Code that cannot be imported: ``InputError``."""
    from tfsurgery.trust import user_code
    files = set()
    for flag, spec in _flag_values(options, CODE_OPTIONS):
        files.update(user_code.loaded_files(spec, flag))
    return sorted(files)


def _flag_values(options: Sequence[str], flags: Sequence[str]) -> List[tuple]:
    """(flag, value) of each of ``flags`` among ``options``, as ``--flag V`` or ``--flag=V``."""
    pairs = [option.partition("=") + (after,) for option, after in
             zip(options, [*options[1:], None])]
    return [(flag, value if equals else after) for flag, equals, value, after in pairs
            if flag in flags and (equals or after is not None)]


def _content_hash(path: Path) -> str:
    """A file's bytes, or every file of a folder (by relative path), as one digest."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path) if file != path else "").encode() + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def up_to_date(model: Path, folder: Path, fingerprint: str, options: Sequence[str] = ()
               ) -> Optional[dict]:
    """The stamped record of ``folder`` when its outputs were made with the same options and
    are all present and newer than the model (and any file the options name, e.g.
    --samples); else None."""
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("fingerprint") != fingerprint:
        return None
    outputs = [folder / Path(a["path"]).name for a in stamp["record"]["artefacts"]]
    if not outputs or not all(path.exists() for path in outputs):
        return None
    inputs = [model] + [Path(path) for path in named_paths(options)]
    newest_input = max(t for path in inputs for t in _mtimes(path))
    oldest_output = min(t for path in outputs for t in _mtimes(path))
    return stamp["record"] if oldest_output > newest_input else None


# ---------------------------------------------------------------- one model (in a worker)
def run_job(job: dict) -> dict:
    """Run one model's ``tfsurgery optimize`` in its own process group, killed at the deadline;
    publish its outputs if it passed. Plain dicts in and out (a Ray worker runs this too).
    Never raises for the model's sake: every outcome, an error of ours included, is a record."""
    started = time.monotonic()
    try:
        record = _run_and_pack(job) if job.get("ship") else _run_and_publish(job)
    except Exception as error:         # e.g. a full disk while publishing: this model only
        shutil.rmtree(job["stage"], ignore_errors=True)
        record = {"model": job["label"], "output_dir": job["name"], "status": "error",
                  "exit_code": None, "nodes_before": None, "nodes_after": None,
                  "max_error": None, "tolerance": None, "artefacts": [],
                  "log": os.path.relpath(job["log"], job["out_dir"]),
                  "error": f"batch: {type(error).__name__}: {error}"}
    record["seconds"] = round(time.monotonic() - started, 3)
    return record


def _run_and_publish(job: dict) -> dict:
    stage, final = Path(job["stage"]), Path(job["final"])
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    Path(job["log"]).parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tfsurgery", "optimize", job["model"], *job["argv"]]
    code, timed_out = _run_with_deadline(command, job)
    report = _read_json(stage / "report.json")
    record = _record(job, report, code, timed_out)
    if record["status"] == "ok":
        record = _publish(job, record, report)
    else:
        _remove_outputs(final)               # OUT_DIR holds the models that are ok, only
    shutil.rmtree(stage, ignore_errors=True)
    return record


def _run_and_pack(job: dict) -> dict:
    """On a cluster node: the model runs in a staging folder on the node's own disk; its log and
    (passed) outputs travel back in the record (``payload``, a tar) for :func:`_received`."""
    with tempfile.TemporaryDirectory(prefix="tfsurgery-batch-") as local:
        here = dict(job, stage=os.path.join(local, "stage"), log=os.path.join(local, "log"))
        here["argv"] = _moved(job["argv"], job["stage"], here["stage"])
        Path(here["stage"]).mkdir()
        command = [sys.executable, "-m", "tfsurgery", "optimize", job["model"], *here["argv"]]
        code, timed_out = _run_with_deadline(command, here)
        report = _read_json(Path(here["stage"]) / "report.json")
        record = dict(_record(here, report, code, timed_out),
                      log=os.path.relpath(job["log"], job["out_dir"]))
        if record["status"] == "ok":      # its paths as the driver will publish them
            _write_json_atomically(Path(here["stage"]) / "report.json",
                                   _moved(report, here["stage"], job["stage"]))
        record["payload"] = _packed(here["stage"] if record["status"] == "ok" else None,
                                    here["log"])
    return record


def _packed(stage: Optional[str], log_path: str) -> bytes:
    """The staging folder (as ``stage/``) and the log (as ``log``), one gzipped tar."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(log_path, arcname="log")
        if stage is not None:
            archive.add(stage, arcname="stage")
    return buffer.getvalue()


def _received(job: dict, record: dict) -> dict:
    """On the driver: a record from a cluster node brings its log and outputs, unpacked into
    the staging folder here and published as a local run's are (other records: as they are)."""
    payload = record.pop("payload", None)
    if payload is None:
        return record
    record["received_bytes"] = len(payload)
    stage, work = Path(job["stage"]), Path(job["stage"]).with_name(f"{job['name']}.received")
    shutil.rmtree(work, ignore_errors=True)          # a crashed run's leftovers: never published
    try:
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as archive:
            archive.extractall(work, filter="data")
        Path(job["log"]).parent.mkdir(parents=True, exist_ok=True)
        os.replace(work / "log", job["log"])
        if record["status"] != "ok":
            _remove_outputs(Path(job["final"]))
            return record
        shutil.rmtree(stage, ignore_errors=True)
        os.replace(work / "stage", stage)
        return _publish(job, record, _read_json(stage / "report.json"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(stage, ignore_errors=True)


def checked_visible(record: dict, out_dir: Path) -> dict:
    """A declared shared OUT_DIR: every output a node wrote must be here, a file at its recorded
    size, else the model is an error (the summary never calls ok what the driver cannot see)."""
    paths = [(Path(out_dir) / a["path"], a.get("bytes")) for a in record["artefacts"]]
    missing = [str(path) for path, size in paths if not path.is_dir() and not (
        path.is_file() and size in (None, path.stat().st_size))]
    if record["status"] != "ok" or not missing:
        return record
    return dict(record, status="error", artefacts=[], error=(
        f"{missing[0]}: written on the node but not visible here: OUT_DIR is not shared with "
        "the cluster (without --ray-shared-output the outputs travel back)"))


def _run_with_deadline(command: List[str], job: dict):
    """(exit code, timed out): the process and its children are killed at the deadline."""
    with open(job["log"], "wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=job["env"], cwd=job["cwd"],
                                   start_new_session=True)
        with _RUNNING_LOCK:
            _RUNNING.add(process)
        try:
            return process.wait(timeout=job["timeout"]), False
        except subprocess.TimeoutExpired:
            _kill(process)
            return process.wait(), True
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(process)


# The model processes running now: in sessions of their own (so a deadline kills exactly one
# model's group), they never see the terminal's Ctrl-C — an interrupted batch kills them.
_RUNNING: set = set()
_RUNNING_LOCK = threading.Lock()


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)       # its own session: only its group goes
    except ProcessLookupError:
        pass                                          # already gone


def _kill_running() -> None:
    with _RUNNING_LOCK:
        for process in list(_RUNNING):
            _kill(process)


def _record(job: dict, report: Optional[dict], code: int, timed_out: bool) -> dict:
    """What the summary says of one run: status, node counts, errors, artefacts."""
    status = ("timeout" if timed_out else "ok" if code == 0 else "failed" if code == 1
              else "error" if code == 2 else "crashed")
    if status == "ok" and report is None:
        status = "error"             # e.g. --list-transforms among the options: nothing made
    verification = (report or {}).get("verification") or {}
    record = {"model": job["label"], "output_dir": job["name"], "status": status,
              "exit_code": code,
              "nodes_before": ((report or {}).get("before") or {}).get("nodes"),
              "nodes_after": ((report or {}).get("after") or {}).get("nodes"),
              "max_error": verification.get("max_error"),
              "tolerance": verification.get("tolerance"), "artefacts": [],
              "log": os.path.relpath(job["log"], job["out_dir"]), "error": None}
    if timed_out:
        record["error"] = f"no result within the {job['timeout']:g} s deadline (killed)"
    elif status != "ok":
        record["error"] = _last_error_line(job["log"]) or (
            "no report written" if code == 0 else f"exit status {code}")
    return record


def _publish(job: dict, record: dict, report: dict) -> dict:
    """Move the staging folder to ``OUT_DIR/<name>`` (replacing an earlier batch's outputs),
    with the report's paths pointing there and the stamp written last inside."""
    stage, final = Path(job["stage"]), Path(job["final"])
    report = _moved(report, str(stage), str(final))
    record["artefacts"] = [
        {"format": a["format"], "path": os.path.relpath(a["path"], job["out_dir"]),
         "bytes": a.get("bytes"), "max_error": a.get("max_error"), "passed": a.get("passed")}
        for a in report.get("artefacts", []) if a.get("written", True) and "path" in a]
    _write_json_atomically(stage / "report.json", report)
    _write_json_atomically(stage / STAMP, {"fingerprint": job["fingerprint"], "record": record})
    if final.exists() and not (final / STAMP).exists():
        record.update(status="error", artefacts=[], error=(
            f"{final} exists and was not written by tfsurgery batch: not replaced"))
        return record
    old = final.with_name(f"{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(stage, final)
    shutil.rmtree(old, ignore_errors=True)
    return record


def _remove_outputs(final: Path) -> None:
    """An earlier batch's outputs of this model (ours: stamped) — now stale."""
    if (final / STAMP).exists():
        shutil.rmtree(final)


def _moved(value, old: str, new: str):
    """``value`` (JSON data) with every path under ``old`` moved under ``new``."""
    if isinstance(value, dict):
        return {key: _moved(item, old, new) for key, item in value.items()}
    if isinstance(value, list):
        return [_moved(item, old, new) for item in value]
    if isinstance(value, str) and (value == old or value.startswith(old + os.sep)):
        return new + value[len(old):]
    return value


def _last_error_line(log_path: str) -> Optional[str]:
    """The CLI's one-line error ("tfsurgery: error: ..."), else the log's last line."""
    try:
        lines = [line.strip() for line in
                 Path(log_path).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    ours = [line for line in lines if line.startswith("tfsurgery:")]
    return (ours or lines or [None])[-1]


# ---------------------------------------------------------------- engines
def _run_locally(jobs: List[dict], n: int, ray_address=None) -> Iterable[dict]:
    """``n`` model processes at once; the threads here only wait on them."""
    if not jobs:
        return
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=n)
    try:
        for future in concurrent.futures.as_completed([pool.submit(run_job, j) for j in jobs]):
            yield future.result()
    except BaseException:            # Ctrl-C, or the caller stopped: no model outlives us
        pool.shutdown(wait=False, cancel_futures=True)
        _kill_running()
        raise
    pool.shutdown()


def _run_on_ray(jobs: List[dict], n: int, ray_address: Optional[str]) -> Iterable[dict]:
    """The same jobs on Ray: ``n`` pool actors each run one model process at a time. Without
    an address, a local Ray instance of ``n`` CPUs is started (and stopped after)."""
    if not jobs:
        return
    import ray
    from ray.util.multiprocessing import Pool
    started = not ray.is_initialized()
    if started:
        # a local instance's workers import this very checkout of tfsurgery
        env = {"PYTHONPATH": os.pathsep.join(p for p in (_PACKAGE_ROOT,
                                                          os.environ.get("PYTHONPATH")) if p)}
        if ray_address:
            ray.init(address=ray_address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(address="local", num_cpus=n, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING, runtime_env={"env_vars": env})
    try:
        pool = Pool(processes=n)
        try:
            yield from pool.imap_unordered(run_job, jobs)
        finally:
            pool.terminate()
    finally:
        if started:
            ray.shutdown()


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
        from ray.util.multiprocessing import Pool  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------- planning
def _check_request(in_dir: Path, out_dir: Path, options, exports, jobs, timeout, engine):
    if not in_dir.is_dir():
        raise InputError(f"{in_dir}: not a directory")
    if _same(in_dir, out_dir):
        raise InputError(f"{out_dir}: the output folder must not be the input folder")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a directory")
    unknown = sorted(set(exports) - set(EXPORTS))
    if unknown:
        raise InputError(f"unknown export {unknown[0]!r}: choose from {', '.join(EXPORTS)}")
    if not isinstance(jobs, int) or jobs < 1:
        raise InputError(f"jobs must be a positive whole number, not {jobs!r}")
    if not timeout > 0:
        raise InputError(f"the per-model timeout must be positive, not {timeout!r}")
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r}: choose from {', '.join(ENGINES)}")
    if engine == "ray" and not ray_available():
        raise InputError(RAY_MISSING)
    for option in options:
        if option.split("=", 1)[0] in PER_MODEL_OPTIONS:
            raise InputError(f"{option.split('=', 1)[0]}: batch names each model's outputs "
                             "itself (OUT_DIR/<model>/); ask for ONNX, TFLite, SavedModel, "
                             "OpenVINO or a picture with the exports")


def _output_names(models: Sequence[Path]) -> List[str]:
    """Each model's folder name: its stem, with its suffix added where two stems collide."""
    stems = [model.stem if model.is_file() else model.name for model in models]
    return [f"{stem}_{model.suffix.lstrip('.')}" if stems.count(stem) > 1 and model.suffix
            else stem for stem, model in zip(stems, models)]


def _paths(model: Path, name: str, stage: Path, exports: Sequence[str]) -> List[str]:
    """The per-model output options, every path inside the staging folder."""
    suffix = ".pbtxt" if model.is_file() and model.suffix.lower() == ".pbtxt" else ".pb"
    argv = ["-o", str(stage / f"{name}_optimized{suffix}"),
            "--report-json", str(stage / "report.json")]
    targets = {"onnx": ("--onnx", f"{name}.onnx"), "tflite": ("--tflite", f"{name}.tflite"),
               "saved_model": ("--saved-model", f"{name}_saved_model"),
               "openvino": ("--openvino", f"{name}_openvino"),
               "picture": ("--picture", f"{name}.svg")}
    for export in sorted(exports):
        flag, file_name = targets[export]
        argv += [flag, str(stage / file_name)]
    return argv


def _job(model: Path, name: str, out_dir: Path, options, exports, timeout, fingerprint,
         ship: bool = False) -> dict:
    out_dir = out_dir.resolve()
    stage = out_dir / WORK / name
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
               PYTHONPATH=os.pathsep.join(p for p in (_PACKAGE_ROOT,
                                                      os.environ.get("PYTHONPATH")) if p))
    return {"model": str(model.resolve()), "label": model.name, "name": name, "out_dir": str(out_dir),
            "final": str(out_dir / name), "stage": str(stage),
            "log": str(out_dir / LOGS / f"{name}.log"), "cwd": os.getcwd(),
            "argv": [*options, *_paths(model, name, stage, exports)], "timeout": float(timeout),
            "fingerprint": fingerprint, "env": env, "ship": ship}


# ---------------------------------------------------------------- small helpers
def _report(on_done, record: dict) -> dict:
    if on_done is not None:
        on_done(record)
    return record


def _mtimes(path: Path) -> Iterable[float]:
    """A file's modification time, or every file's in a folder (and the folder's own)."""
    yield path.stat().st_mtime
    if path.is_dir():
        for root, _, files in os.walk(path):
            for name in files:
                yield os.stat(os.path.join(root, name)).st_mtime


def _same(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json_atomically(path: Path, data) -> None:
    """A private name in the same folder, then a rename; created with open() so the file gets
    the user's umask like every other output (mkstemp would make it 0600)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "x") as f:
            json.dump(data, f, indent=2, default=str)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _version() -> str:
    from tfsurgery import __version__
    return __version__
