"""Calibration ranges for onnxruntime's histogram methods (Percentile, Entropy), computed as its
calibrator computes them but one row's activations in memory at a time; written to the
calibration cache that ``quantize_static`` reads back (:mod:`tfsurgery.int8.backends.onnx`)."""
import contextlib
import io
from pathlib import Path
from typing import Dict, Optional

import numpy as np

ENTROPY_BINS = (2048, 128)          # histogram bins, quantized bins: TensorRT's entropy method


def entropy_ranges(float_model: Path, make_rows, cache: Path) -> None:
    """Entropy ranges into ``cache`` (read back by quantize_static). quantize_static's own
    Entropy calibrator keeps onnxruntime's defaults of 128 histogram bins for 128 quantized
    bins, which leaves one candidate threshold — the full range, i.e. MinMax; KL-divergence
    calibration needs a finer histogram than the grid it chooses a range for."""
    _histogram_ranges(float_model, make_rows, cache, "Entropy",
                      {"num_bins": ENTROPY_BINS[0], "num_quantized_bins": ENTROPY_BINS[1]})


def percentile_ranges(float_model: Path, make_rows, cache: Path) -> None:
    _histogram_ranges(float_model, make_rows, cache, "Percentile")


def _histogram_ranges(float_model: Path, make_rows, cache: Path, method: str,
                      options: Optional[dict] = None) -> None:
    """``method``'s (Percentile, Entropy) ranges into ``cache``, computed as onnxruntime's
    calibrator computes them — a histogram per tensor over every calibration row (of |x| for
    symmetric Percentile), then its percentile or KL search — but with one row's activations in
    memory at a time: its calibrator keeps every row's until it builds the histograms (about
    90 MiB per row for a ResNet50 at 224; docs/int8.md, Memory). Two passes over the rows
    (``make_rows()`` gives a fresh reader): each tensor's extremes, then its histogram row by
    row within the range numpy would take for all rows at once — the same counts, so the same
    ranges. An empty tensor: onnxruntime's own calibration, all rows at once."""
    import tempfile
    from onnxruntime.quantization import calibrate, registry
    ops = sorted(set(registry.QLinearOpsRegistry) | set(registry.QDQRegistry))
    with tempfile.TemporaryDirectory(prefix="calibration.", dir=cache.parent) as scratch, \
            contextlib.redirect_stdout(io.StringIO()):      # the histogram methods print()
        calibrator = calibrate.create_calibrator(
            Path(float_model), ops, augmented_model_path=str(Path(scratch) / "augmented.onnx"),
            calibrate_method=getattr(calibrate.CalibrationMethod, method),
            providers=["CPUExecutionProvider"], extra_options=options or {})
        absolute = calibrator.method == "percentile" and calibrator.symmetric
        histograms = _row_by_row_histograms(calibrator, make_rows, absolute)
        if histograms is None:
            calibrator.collect_data(make_rows())
        else:
            calibrator.collector = calibrate.HistogramCollector(
                method=calibrator.method, symmetric=calibrator.symmetric,
                num_bins=calibrator.num_bins, num_quantized_bins=calibrator.num_quantized_bins,
                percentile=calibrator.percentile, scenario=calibrator.scenario)
            calibrator.collector.histogram_dict = histograms
        calibrate.save_tensors_data(calibrator.compute_data(), cache)


def _row_by_row_histograms(calibrator, make_rows, absolute: bool) -> Optional[dict]:
    """onnxruntime's ``HistogramCollector.histogram_dict`` for all rows, built one row at a
    time: (counts, edges, min, max) on |x| (``absolute``: its ``collect_absolute_value``), or
    (counts, edges, min, max, threshold) on x within ±threshold (``collect_value``). None for an
    empty tensor or no rows."""
    session = calibrator.infer_session
    names = [o.name for o in session.get_outputs()]
    wanted = [i for i, name in enumerate(names) if name in calibrator.tensors_to_calibrate]

    def activations():
        reader = make_rows()
        while (feeds := reader.get_next()) is not None:
            values = session.run(None, feeds)
            yield {names[i]: values[i] for i in wanted}

    extremes: Dict[str, tuple] = {}
    for row in activations():
        for name, value in row.items():
            if not value.size:
                return None
            magnitude = np.abs(value)           # x's and |x|'s extremes over the rows
            low, high = np.nanmin(value), np.nanmax(value)
            small, large = magnitude.min(), magnitude.max()
            if name in extremes:
                was = extremes[name]
                low, high = np.minimum(was[0], low), np.maximum(was[1], high)
                small, large = np.minimum(was[2], small), np.maximum(was[3], large)
            extremes[name] = (low, high, small, large)
    if not extremes:
        return None
    histograms: Dict[str, tuple] = {}
    for row in activations():
        for name, value in row.items():
            low, high, small, large = extremes[name]
            if absolute:
                hist, edges = np.histogram(np.abs(value), bins=calibrator.num_bins,
                                           range=(small, large))
                entry = (hist, edges.astype(value.dtype), low, high)
            else:
                threshold = np.array(max(abs(low), abs(high)), dtype=value.dtype)
                hist, edges = np.histogram(value, calibrator.num_bins,
                                           range=(-threshold, threshold))
                entry = (hist, edges, low, high, threshold)
            if name in histograms:
                entry = (histograms[name][0] + hist,) + entry[1:]
            histograms[name] = entry
    return histograms
