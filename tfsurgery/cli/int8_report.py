"""The int8 loop's report, printed: the row sets, what was tried and chosen, the gate's verdict
and the speed against float."""
from __future__ import annotations

import sys

from tfsurgery.cli.common import _say


FORMATS = {"onnx": "ONNX", "tflite": "TFLite", "openvino": "OpenVINO IR (NNCF)"}


def _say_int8(args, report) -> None:
    """The int8 loop's report: the rows of each set, what was tried and chosen on the
    selection rows, and the gate's verdict on rows no choice saw."""
    equalized = " of the cross-layer-equalized graph" if report.model == "equalized" else ""
    corrected = ", biases corrected" if report.bias_corrected else ""
    io_type = f", {report.io_type} I/O" if report.format == "tflite" else ""
    how = ("dynamic: activations quantized at run time" if report.mode.startswith("dynamic")
           else f"{report.calibration_method} calibration{corrected}")
    _say(args, f"int8 {FORMATS.get(report.format, report.format)} {report.mode}{equalized} "
               f"({how}{io_type}): "
               f"{report.calibration_rows} calibration, {report.selection_rows} selection, "
               f"{report.gate_rows} gate rows (no choice saw the gate rows)")
    eq = report.equalization
    if eq.get("asked", "off") != "off":
        how = (f"{eq.get('pairs', 0)} layer pair(s) equalized, {eq.get('refused', 0)} refused"
               + (f"; not used: {eq['why']}" if eq.get("why") else ""))
        _say(args, f"  cross-layer equalization ({eq['asked']}): {how}")
        for skipped in eq.get("transform", {}).get("skipped", [])[:5]:
            _say(args, f"    refused {skipped['node']}: {skipped['reason']}")
    if len(report.tried) > 1:
        _say(args, "  tried on the selection rows (error score, lower is better): " + "; ".join(
            f"{a.label}: " + ", ".join(f"{o.measure} {o.value:.4g}"
                                                  for o in a.outputs) + f" ({a.score:.4g})"
            for a in report.tried))
    if len(report.modes) > 1:
        _say(args, f"  modes on the selection rows (written: {report.mode}): "
                   f"{report.modes_line()}")
    if report.sensitivities:
        ranked = sorted(report.sensitivities.items(), key=lambda kv: -kv[1])
        _say(args, "  layer sensitivity on the selection rows (error drop with only that "
                   "layer float): " + ", ".join(f"{report.named(name)} {value:.3g}"
                                                for name, value in ranked[:10]))
    for name in report.kept_float:
        _say(args, f"  kept float: {report.named(name)} (sensitivity "
                   f"{report.sensitivities[name]:.3g})")
    for selected, final in zip(report.selection_outputs, report.outputs):
        bound = (f" (95% lower bound {final.lower_bound:.4g} on {final.compared} rows)"
                 if final.lower_bound is not None else "")
        _say(args, f"  gate {final.name}: {final.measure} {final.value:.4g}{bound}, threshold "
                   f"{final.threshold:g}: {'ok' if final.passed else 'MISSED'} (selection "
                   f"rows: {selected.value:.4g})")
    if report.accuracy is not None:
        a = report.accuracy
        _say(args, f"  gate accuracy ({a.output}, {a.rows} labelled rows): float "
                   f"{a.float_accuracy:.4g}, int8 {a.int8_accuracy:.4g}, drop {a.drop:.4g} "
                   f"(max {a.max_drop:g}): {'ok' if a.passed else 'MISSED'}")
    for note in report.notes:
        _say(args, f"  note: {note}")
    for name, q in report.io_quantization.items():
        _say(args, f"  int8 {name}: scale {q['scale']:.6g}, zero point {q['zero_point']}")
    _say_int8_speed(args, report)


def _say_int8_speed(args, report) -> None:
    """The ONNX int8 target (what and why) and its speed against float on this machine —
    loudly, on stderr even with -q, when int8 is not faster."""
    target = report.target
    if target:       # dynamic: the same weights; activations uint8, quantized at run time
        activations = "uint8 at run time" if report.mode.startswith("dynamic") else \
            target["activations"]
        _say(args, f"  int8 target {target['target']}: activations {activations}, "
                   f"weights {target['weights']}{' per-channel' if target['per_channel'] else ''}"
                   f"{', reduce_range' if target['reduce_range'] else ''} ({target['why']})")
    if report.speed.get("faster"):
        _say(args, f"  {report.speed['line']}")
    elif report.speed:
        print(f"tfsurgery: {report.speed['line']}", file=sys.stderr)

