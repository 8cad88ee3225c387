"""Bench: latency, each runtime in its own process.

- ``command``: ``tfsurgery bench`` (``bench``, ``bench_runtimes``, ``bench_int8``);
- ``latency``: before/after in TensorFlow and onnxruntime, interleaved;
- ``runtimes``: the model in every installed runtime, each artefact checked.
"""
