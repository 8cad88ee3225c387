"""--layout NHWC against its NCHW original: a ResNet-style NCHW graph timed in TensorFlow.

    python -m benchmarks.layout [--runs 30] [--batch 8] [--size 64]
    python scripts/benchmark.py --layout      # the same, printed

The NCHW original runs on a CPU only with oneDNN (TF_ENABLE_ONEDNN_OPTS=1); the result of
``tfsurgery optimize --layout NHWC`` runs with it and without. oneDNN is chosen when TensorFlow
starts, so each setting is a process of its own; within the oneDNN process original and result
take turns (tfsurgery.bench.latency.interleaved), so their ratio is fair on a busy machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def resnet_nchw(seed: int = 0, size: int = 64, width: int = 64, blocks: int = 3):
    """Stem (7x7/2 conv, BN, ReLU, 3x3/2 max pool), ``blocks`` bottleneck blocks (1x1, 3x3, 1x1
    conv, each with a FusedBatchNormV3, a projection shortcut on the first, residual Add, ReLU),
    global average pool, dense: all NCHW, random weights."""
    import tensorflow as tf
    r = np.random.default_rng(seed)

    def conv(x, cin, cout, k, stride=1):
        kernel = (r.standard_normal([k, k, cin, cout]) * np.sqrt(2 / (k * k * cin)))
        return tf.nn.conv2d(x, kernel.astype(np.float32), stride, "SAME", data_format="NCHW")

    def bn(x, c):
        def vec(low, high):
            return tf.constant(r.uniform(low, high, c).astype(np.float32))
        return tf.raw_ops.FusedBatchNormV3(x=x, scale=vec(0.5, 1.5), offset=vec(-0.5, 0.5),
                                           mean=vec(-0.5, 0.5), variance=vec(0.5, 2),
                                           epsilon=1e-3, data_format="NCHW",
                                           is_training=False)[0]

    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3, size, size], name="input")
        y = tf.nn.relu(bn(conv(x, 3, width, 7, 2), width))
        y = tf.nn.max_pool2d(y, 3, 2, "SAME", data_format="NCHW")
        channels = width
        for block in range(blocks):
            out = 4 * width
            h = tf.nn.relu(bn(conv(y, channels, width, 1), width))
            h = tf.nn.relu(bn(conv(h, width, width, 3), width))
            h = bn(conv(h, width, out, 1), out)
            shortcut = bn(conv(y, channels, out, 1), out) if block == 0 else y
            y = tf.nn.relu(h + shortcut)
            channels = out
        y = tf.reduce_mean(y, [2, 3])
        dense = r.standard_normal([channels, 10]).astype(np.float32) / np.sqrt(channels)
        tf.identity(tf.matmul(y, dense), name="output")
    return graph.as_graph_def()


def _child(folder: Path, names, runs: int) -> None:
    """In this process (oneDNN as the environment says): time the graphs, print JSON."""
    import tensorflow as tf
    from tfsurgery.bench import latency
    feeds = dict(np.load(folder / "feeds.npz"))
    runners = {}
    for name in names:
        graph_def = tf.compat.v1.GraphDef.FromString((folder / f"{name}.pb").read_bytes())
        runners[name] = latency.tf_runner(graph_def, feeds, ["output"])
    times = latency.interleaved(runners, runs)
    rows = latency.summarise("tensorflow", times, latency.threads())
    print(json.dumps({row.variant: row.median_ms for row in rows}))


def _timed(folder: Path, names, runs: int, onednn: bool) -> dict:
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1" if onednn else "0",
           "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.layout", "--child", str(folder),
                           "--runs", str(runs), *names], env=env, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(runs: int = 30, batch: int = 8, size: int = 64) -> dict:
    """Node/transpose counts and medians: the original (oneDNN) and the NHWC result (oneDNN on
    and off), with the tool's own verification passed."""
    from tfsurgery import api
    original = resnet_nchw(size=size)
    result = api.optimize(original, interface=api.Interface(inputs=["input"],
                                                            outputs=["output"]),
                          options=api.RunOptions(layout="NHWC"))
    lean = result.graph_def
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "original.pb").write_bytes(original.SerializeToString())
        (folder / "nhwc.pb").write_bytes(lean.SerializeToString())
        feed = np.random.default_rng(0).standard_normal([batch, 3, size, size])
        np.savez(folder / "feeds.npz", input=feed.astype(np.float32))
        with_onednn = _timed(folder, ["original", "nhwc"], runs, onednn=True)
        without = _timed(folder, ["nhwc"], runs, onednn=False)

    def count(graph_def, test):
        return sum(1 for node in graph_def.node if test(node))

    def nchw(node):
        return "data_format" in node.attr and node.attr["data_format"].s.startswith(b"NC")

    return {
        "nodes": {"original": len(original.node), "nhwc": len(lean.node)},
        "nchw_ops": {"original": count(original, nchw), "nhwc": count(lean, nchw)},
        "transposes": {"original": count(original, lambda n: n.op == "Transpose"),
                       "nhwc": count(lean, lambda n: n.op == "Transpose")},
        "verified": bool(result.verification and result.verification.passed),
        "ms": {"original, oneDNN": with_onednn["original"], "nhwc, oneDNN": with_onednn["nhwc"],
               "nhwc, no oneDNN": without["nhwc"]},
        "ratio": with_onednn["nhwc"] / with_onednn["original"],
        "batch": batch, "size": size, "runs": runs,
    }


def render(row: dict) -> str:
    ms = row["ms"]
    return "\n".join([
        "## NCHW → NHWC (`--layout NHWC`)", "",
        f"ResNet-style NCHW graph (3 bottleneck blocks, batch {row['batch']}, "
        f"{row['size']}×{row['size']}), TensorFlow, median of {row['runs']} interleaved runs; "
        "the original runs only with oneDNN.", "",
        "| graph | nodes | NCHW ops | Transposes | ms, oneDNN | ms, no oneDNN |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| original | {row['nodes']['original']} | {row['nchw_ops']['original']} | "
        f"{row['transposes']['original']} | {ms['original, oneDNN']:.2f} | refused |",
        f"| `--layout NHWC` | {row['nodes']['nhwc']} | {row['nchw_ops']['nhwc']} | "
        f"{row['transposes']['nhwc']} | {ms['nhwc, oneDNN']:.2f} | {ms['nhwc, no oneDNN']:.2f} |",
        "", f"NHWC / original with oneDNN: {row['ratio']:.2f}× the time "
        f"(verification {'passed' if row['verified'] else 'FAILED'}).", ""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.names, args.runs)
        return 0
    row = measure(args.runs, args.batch, args.size)
    print(render(row))
    print(json.dumps(row), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
