"""Development tools, not installed: the benchmark harness behind ``scripts/benchmark.py``
(``harness``: tfsurgery against its peers) and the training-ops step benchmark (``training``)."""
