"""Limits: a 200k-node graph through every transform (no recursion, bounded memory and time), and
protobuf's 2 GiB ceiling — tested without building 2 GiB in CI.

Memory is measured in a fresh subprocess as the peak resident set (Linux VmHWM, reset just before
the run through /proc/self/clear_refs) minus the resident set before it. Against the graph as it
lives in memory (upb holds a parsed GraphDef in ~2.8x its wire size) the peak is ~2.9x — the input
stays, the output is a second graph, the index and the folded weights are the rest; that is the
target, "~3x the graph's size". Against the wire size it is ~7-8x.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfsurgery import io

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = 20_000                       # x 10 nodes per block = 200k nodes
HARD_BOUND = 12.0                     # x the wire size; measured ~7-8x
MEMORY_TARGET = 3.5                    # x the parsed graph in memory: target ~3x, measured ~2.9x
LINEAR_BOUND = 30                     # x the parse+serialize floor: twice the 15x goal
                                      # (docs/performance.md: measured 12-13x)
GiB = 2 ** 30
PROTOBUF_LIMIT = 2 ** 31

_MEASURE = textwrap.dedent("""
    import gc, json, os, sys, time
    sys.path.insert(0, sys.argv[1])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from tfsurgery.models import synthetic
    from tfsurgery import pipeline
    from tfsurgery.contract import Options

    def status(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024

    options = Options(inputs=["input"], outputs=["output"])
    # every transform but float16-weights and int8-weights (storage formats, not simplifications:
    # they turn each weight into two or four nodes, which the node count and memory bounds below
    # do not describe) and equalize-cross-layer (int8 calibration only, never in a plain run)
    order = [name for name in pipeline.ORDER
             if name not in ("float16-weights", "int8-weights", "equalize-cross-layer")]
    pipeline.run(synthetic.repeated_blocks(2).graph_def, order, options)      # warm up imports
    with open(sys.argv[2], "rb") as f:        # built by the test: this process never held more
        wire = f.read()
    size = len(wire)
    # Both timed in CPU seconds of this process (process_time): other processes on a busy
    # machine stretch wall time, and stretch Python's pipeline more than protobuf's C++ floor.
    floors = []                                # the floor: what parsing and writing it costs,
    for _ in range(3):                         # the median of three (one run is noisy)
        start = time.process_time()
        type(synthetic.repeated_blocks(1).graph_def).FromString(wire).SerializeToString()
        floors.append(time.process_time() - start)
    floor = sorted(floors)[1]
    gc.collect()
    gc.collect()
    unparsed = status("VmRSS")
    graph_def = type(synthetic.repeated_blocks(1).graph_def).FromString(wire)
    del wire
    gc.collect()
    parsed = status("VmRSS") - unparsed + size      # the parsed GraphDef's own footprint
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                            # reset the peak RSS (VmHWM) to the current RSS
        reset = True
    except OSError:
        reset = False
    before = status("VmRSS")
    sys.setrecursionlimit(200)                      # any per-node recursion would hit this
    start = time.process_time()
    out, reports = pipeline.run(graph_def, order, options)
    seconds = time.process_time() - start
    sys.setrecursionlimit(1000)
    peak = status("VmHWM")
    print(json.dumps({
        "nodes": len(graph_def.node), "bytes": size, "out_nodes": len(out.node),
        "out_ops": sorted({n.op for n in out.node}), "seconds": seconds, "floor": floor,
        "out_non_const": sum(n.op != "Const" for n in out.node),
        "peak_delta": peak - before, "peak_reset": reset, "parsed": parsed,
        "reports": {r.name: [len(r.rewritten), r.removed_nodes, round(r.seconds, 2)]
                    for r in reports}}))
""")


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    from tfsurgery.models import synthetic
    folder = tmp_path_factory.mktemp("limits")
    script, graph = folder / "measure.py", folder / "blocks.pb"
    script.write_text(_MEASURE)
    graph.write_bytes(synthetic.repeated_blocks(BLOCKS).graph_def.SerializeToString())
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, str(script), str(ROOT), str(graph)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout.strip().splitlines()[-1])
    # Without /proc/self/clear_refs the peak cannot be reset before the run; then VmHWM is the
    # larger of the run's peak and what came before it in this fresh process (reading the file:
    # at most one more copy of the wire bytes). peak − before is then an upper bound, tighter by
    # at most those bytes: the bounds below get that much slack, never a skip.
    slack = 0 if data["peak_reset"] else data["bytes"]
    data["ratio"] = (data["peak_delta"] - slack) / data["bytes"]
    data["in_memory_ratio"] = (data["peak_delta"] - slack) / data["parsed"]
    print(f"\n200k nodes: {data['bytes'] / 2 ** 20:.0f} MiB serialized, pipeline "
          f"{data['seconds']:.1f} s CPU = {data['seconds'] / data['floor']:.1f}x the parse+serialize "
          f"floor, peak +{data['peak_delta'] / 2 ** 20:.0f} MiB = "
          f"{data['ratio']:.1f}x the serialized size, {data['in_memory_ratio']:.1f}x the parsed "
          f"GraphDef ({data['parsed'] / 2 ** 20:.0f} MiB); {data['reports']}")
    return data


def test_200k_nodes_go_through_every_transform(big_run):
    assert big_run["nodes"] >= 200_000
    # every block: conv+bias+BN -> Conv2D + BiasAdd (+ 2 Const) + Relu; plus input and output.
    # Blocks with equal folded weights share their Consts (merge-duplicates).
    assert big_run["out_non_const"] == 3 * BLOCKS + 2, big_run["reports"]
    assert big_run["out_nodes"] <= 5 * BLOCKS + 2, big_run["reports"]
    assert not [op for op in big_run["out_ops"] if op.startswith("FusedBatchNorm")]
    assert big_run["reports"]["fold-batch-norm"][0] == BLOCKS
    # No quadratic pass, and the speed goal kept: `pipeline.run` (every transform, no
    # verification) against parsing + writing the same graph, timed in the same process (a
    # ratio, not seconds). The goal is 15x (scripts/benchmark.py --scaling measures it: 12-13x,
    # docs/performance.md); this guard allows twice that for a busy machine. A per-node scan
    # of the graph anywhere would make it hundreds of times the floor.
    assert big_run["seconds"] <= LINEAR_BOUND * big_run["floor"], big_run


def test_200k_nodes_peak_memory_is_bounded(big_run):
    assert big_run["ratio"] <= HARD_BOUND, big_run


def test_200k_nodes_peak_memory_meets_the_issue_target(big_run):
    assert big_run["in_memory_ratio"] <= MEMORY_TARGET, big_run


# ---------------------------------------------------------------- protobuf's 2 GiB limit
@pytest.fixture
def huge_sparse_pb(tmp_path, monkeypatch):
    """A 2 GiB + 1 byte .pb that takes no disk space (sparse) and must never be read into memory:
    reading it fails the test instead of allocating 2 GiB."""
    path = tmp_path / "huge.pb"
    with open(path, "wb") as handle:
        handle.truncate(PROTOBUF_LIMIT + 1)
    real = Path.read_bytes

    def guarded(self):
        if self.exists() and self.stat().st_size >= PROTOBUF_LIMIT:
            raise AssertionError(f"read {self} ({self.stat().st_size} bytes) into memory")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", guarded)
    return path


def test_cli_refuses_a_graph_file_over_2gib_without_reading_it(huge_sparse_pb, capsys):
    from tfsurgery.cli import main
    code = main([str(huge_sparse_pb), "--bn-fold"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "2 GiB" in err[0] or "2 GB" in err[0], err
    assert sorted(p.name for p in huge_sparse_pb.parent.iterdir()) == ["huge.pb"]


def test_loader_refuses_a_graph_file_over_2gib_without_reading_it(huge_sparse_pb):
    with pytest.raises(io.InputError, match="2 GiB|2 GB"):
        io.load_graph_def(huge_sparse_pb)


class _HugeGraphDef:
    """Stands in for an optimized GraphDef of 2 GiB + 100 bytes (BN folding copies a shared
    weight, so a graph just under the limit can grow past it). protobuf (upb) serializes such a
    message without complaint, but no protobuf parser — TensorFlow's included — reads it back."""

    node = ()

    def ByteSize(self):
        return PROTOBUF_LIMIT + 100

    def SerializeToString(self, **kwargs):
        raise AssertionError("serialized a GraphDef beyond protobuf's 2 GiB limit")


def test_saving_a_graph_over_2gib_is_refused(tmp_path):
    with pytest.raises(io.InputError, match="2 GiB|2 GB"):
        io.save_graph_def(_HugeGraphDef(), tmp_path / "out.pb")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TFSURGERY_HUGE_TESTS") != "1",
                    reason="builds a real 2.2 GiB GraphDef (~7 GB RAM, ~1 min); "
                           "set TFSURGERY_HUGE_TESTS=1")
def test_real_graph_over_2gib_is_refused_on_save(tmp_path):
    from tensorflow.core.framework import graph_pb2
    graph_def = graph_pb2.GraphDef()
    half = (PROTOBUF_LIMIT // 2 + 64 * 2 ** 20) // 4 * 4
    for i in range(2):
        node = graph_def.node.add(name=f"weights_{i}", op="Const")
        node.attr["dtype"].type = 1
        tensor = node.attr["value"].tensor
        tensor.dtype = 1
        tensor.tensor_shape.dim.add(size=half // 4)
        tensor.tensor_content = bytes(half)
    assert graph_def.ByteSize() >= PROTOBUF_LIMIT
    with pytest.raises(io.InputError, match="2 GiB|2 GB"):
        io.save_graph_def(graph_def, tmp_path / "out.pb")
    assert list(tmp_path.iterdir()) == []
