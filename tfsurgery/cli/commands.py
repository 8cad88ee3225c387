"""The subcommands' work: each parses nothing, calls the API and prints what it found.
``run(args)`` dispatches; every failed check exits 1 with nothing written."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from tfsurgery.cli.bench import _bench
from tfsurgery.cli.common import (_check_verification, _checks, _interface, _optimized,
                                  _options, _preprocess, _say, _size, _split)
from tfsurgery.cli.int8_report import _say_int8


def run(args) -> int:
    """The subcommand ``args.command``, with its options: its exit status."""
    from tfsurgery import api
    if args.command == "compare":
        return _compare(args)
    if args.command == "batch":
        return _batch(args)
    api.load_plugins(args.plugin)
    if args.list_transforms:
        _say(args, api.format_table(api.list_transforms(),
                                    headers=("transform", "runs", "from", "what it does",
                                             "parameters (--param)")))
        return 0
    transforms = api.choose_transforms(_split(args.transforms), bn_fold=args.bn_fold,
                                       enable=args.enable + (["layout-nhwc"] if args.layout
                                                             else []), disable=args.disable)
    args.preprocess = _preprocess(args)       # bad values: exit 2 before loading the model
    saved_model = _saved_model_path(args)
    api.check_output_paths([getattr(args, option, None)         # before minutes of work
                            for option in ("output", "report_json", "onnx", "picture", "tflite")
                            if not (option == "output" and _saved_model_from_output(args))],
                           opset=getattr(args, "opset", None),
                           picture_path=getattr(args, "picture", None))
    if getattr(args, "quantize", None):
        api.check_int8_request(args.samples, args.quantize, args.command == "export" or
                               bool(args.onnx) or bool(args.tflite)
                               or bool(getattr(args, "openvino", None)),
                               _split(args.inputs_as_nchw), weights=args.weights,
                               check_samples=args.check_samples, labels=args.labels)
        api.check_int8_speed_request(args.int8_target, args.int8_min_speedup)
    _check_named_files(args)
    if saved_model is not None:
        api.check_saved_model_target(saved_model, force=args.force, input_path=args.input)
    _check_openvino_request(api, args)
    if args.command == "inspect" and args.input and not args.load:
        scanned = api.scan(args.input)            # a SavedModel or Keras file: not loaded
        if scanned is not None:
            return _inspect_unloaded(args, scanned)
    try:
        source = api.load(args.input, args.signature, trust=args.trust_model,
                          imports=args.imports) if args.input else api.demo()
    except api.UnsafeModel as refused:
        if args.command == "inspect":
            _lists_outside_ops(args, refused)
        raise
    if getattr(args, "picture", None):
        api.check_drawable(source, args.picture_scope)
    # the rows counted in seconds, before optimizing (raw preprocessed inputs: checked later)
    if getattr(args, "quantize", None) and not args.preprocess.given():
        api.check_int8_rows(source, args.samples, thresholds=_int8_thresholds(api, args),
                            check_samples=args.check_samples,
                            check_fraction=args.check_fraction, labels=args.labels,
                            inputs=_split(args.inputs), outputs=_split(args.outputs))
    if args.command == "inspect":
        return _inspect(args, source, transforms)
    if args.command == "bench":
        return _bench(args, source, transforms)
    return _optimize(args, source, transforms)


def _check_named_files(args) -> None:
    """An option naming a file to read that does not exist: one line, exit 2, before the
    model is loaded (issue 41)."""
    from tfsurgery import api
    for option in ("samples", "check_samples", "labels"):
        path = getattr(args, option, None)
        if path is not None and not Path(path).exists():
            raise api.InputError(f"--{option.replace('_', '-')} {path}: no such file or "
                                 "directory")


def _check_openvino_request(api, args) -> None:
    """--openvino: installed, a precision this CPU runs, a writable directory — before any
    work; --openvino-precision/-tolerance without --openvino: one line."""
    if getattr(args, "openvino", None):
        api.check_openvino_target(args.openvino, precision=args.openvino_precision,
                                  force=args.force, input_path=args.input)
    elif getattr(args, "openvino_precision", "f32") != "f32" or \
            getattr(args, "openvino_tolerance", None) is not None:
        raise api.InputError("--openvino-precision and --openvino-tolerance need --openvino DIR")


def _optimize(args, source, transforms) -> int:
    """``optimize`` (writes the .pb, and the ONNX model with --onnx) and ``export`` (ONNX only):
    the API writes every target, all or nothing; here it is printed. Any failed check exits 1
    with nothing written."""
    from tfsurgery import api
    targets = _targets(args, source)
    result = _optimized(api, source, transforms, args, verify=not args.no_verify,
                        tolerance=args.tolerance)
    _say(args, f"{source.label}: {len(source.graph_def.node)} → "
               f"{len(result.graph_def.node)} nodes")
    _say(args, api.comparison_table(source.graph_def, result.graph_def))
    for line in api.transform_lines(result.reports, verbose=args.verbose):
        _say(args, line)
    for report in result.reports:           # loud, even with -q: the model's answers changed
        for line in report.warnings:
            print(f"tfsurgery: warning: {report.name}: {line}", file=sys.stderr)
    _interface_notes(args, result)
    data = result.as_report()
    data["artefacts"] = []
    code = _check_verification(args, result)
    if code == 0:
        failed = None
        try:
            written = api.write(source, result, targets)
        except api.WriteFailed as error:
            failed, written, code = error, error.written, 1
        _say_checks(args, result, written)
        if failed is not None:
            print(f"tfsurgery: {failed.stage} FAILED: {failed}; nothing written"
                  f"{_alone_hint(args, source, failed.stage)}", file=sys.stderr)
        else:
            _say_written(args, written.artefacts)
        data.update(written.report())
    if args.report_json:           # last: it describes outputs that now exist (or a failed check)
        api.write_json(args.report_json, data, input_path=source.path)
    if code == 0 and args.picture:
        _say(args, f"wrote {args.picture}")
    return code


# the option each export stage comes from: dropping it writes the verified graph alone
STAGE_OPTIONS = (("int8", "--quantize int8"), ("ONNX", "--onnx"), ("SavedModel", "--saved-model"),
                 ("TFLite", "--tflite"), ("OpenVINO", "--openvino"))


def _alone_hint(args, source, stage: str) -> str:
    """How to get the verified graph when an export of it failed (all or nothing lost it)."""
    if args.command == "export":
        model = source.path or source.label
        return f"; the verified graph alone: tfsurgery optimize {model} -o OUT.pb (same options)"
    option = next((flag for word, flag in STAGE_OPTIONS if word in stage), None)
    return f"; the verified graph alone: the same command without {option}" if option else ""


def _targets(args, source):
    """What to write, from the options (the API decides how)."""
    from tfsurgery import api
    exporting = args.command == "export"
    int8 = None
    if getattr(args, "quantize", None):
        int8 = api.Int8Targets(
            samples=args.samples, check_samples=args.check_samples,
            check_fraction=args.check_fraction,
            labels=args.labels,
            thresholds=_int8_thresholds(api, args),
            calibration=args.int8_calibration, equalize=args.int8_equalize,
            bias_correction=args.int8_bias_correction, tflite_io=args.tflite_io,
            target=args.int8_target, min_speedup=args.int8_min_speedup, modes=args.int8_mode)
    return api.Targets(
        pb=None if exporting or _saved_model_from_output(args) else (
            Path(args.output) if args.output else api.default_output_path(source)),
        saved_model=_saved_model_path(args), force=getattr(args, "force", False),
        tflite=getattr(args, "tflite", None) or None, onnx=_onnx_path(args, source),
        opset=getattr(args, "opset", None), inputs_as_nchw=_split(getattr(args, "inputs_as_nchw",
                                                                           None)),
        ort_optimize=not getattr(args, "raw_onnx", False), int8=int8,
        onnx_fusions=_onnx_fusions(args),
        openvino=getattr(args, "openvino", None) or None,
        openvino_precision=getattr(args, "openvino_precision", "f32"),
        openvino_tolerance=getattr(args, "openvino_tolerance", None),
        picture=getattr(args, "picture", None) or None,
        picture_scope=getattr(args, "picture_scope", None), allow_unverified=args.no_verify)


def _int8_thresholds(api, args):
    return api.Int8Thresholds(args.int8_min_agreement, args.int8_min_sqnr,
                              args.int8_max_float_layers, args.int8_max_accuracy_drop)


def _say_checks(args, result, written) -> None:
    """What each export's conversion and check found, in the order they ran."""
    from tfsurgery import api
    exported = written.onnx
    if exported is not None:
        path = Path(written.onnx_record["path"])
        _say(args, f"ONNX (opset {exported.opset}): {exported.node_count} nodes "
                   f"({exported.converted_node_count} from tf2onnx"
                   f"{''.join(f'; {n} {what}' for what, n in exported.tidied.items())})"
                   f"{', weights in ' + path.name + '.data' if exported.external_data else ''}")
        for line in exported.fusion_lines:
            _say(args, line)
        _say(args, api.format_table(
            _side_by_side(api.summary(result.graph_def), exported),
            headers=("TF after", "count", "ONNX", "count")))
        _say(args, f"ONNX check: max error {exported.max_error:.3g} vs {exported.reference} "
                   f"(tolerance {exported.tolerance:g}; onnx.checker passed)")
        for entry in exported.left_out:
            _say(args, f"ONNX made without {entry['transform']}, after which tf2onnx refuses "
                       f"the graph ({entry['why']}); that graph verified against the original: "
                       f"{entry['verification']}")
    if written.int8 is not None:
        _say_int8(args, written.int8)
    for artefact in written.checks:
        _say(args, f"{CHECK_NAMES[artefact.format]} check: {api.check_line(artefact)}")
    if written.tflite_int8 is not None:
        _say_int8(args, written.tflite_int8)
    if written.openvino_int8 is not None:
        _say_int8(args, written.openvino_int8)


CHECK_NAMES = {"saved_model": "SavedModel", "tflite": "TFLite", "openvino": "OpenVINO"}


def _say_written(args, artefacts: list) -> None:
    """One line per artefact written: its path, size and check result."""
    import math
    for artefact in artefacts:
        check = artefact.checked_by
        if math.isfinite(artefact.max_error):
            check += (f" against {artefact.reference}: max error {artefact.max_error:.3g} "
                      f"(tolerance {artefact.tolerance:g})")
        _say(args, f"wrote {artefact.path} ({FORMAT_NAMES[artefact.format]}, "
                   f"{artefact.weights} weights, {_size(artefact.bytes)}); {check}")


FORMAT_NAMES = {"pb": "frozen graph", "onnx": "ONNX", "saved_model": "SavedModel",
                "tflite": "TFLite", "openvino": "OpenVINO IR"}


def _interface_notes(args, result) -> None:
    """How the source was frozen, and the inputs that no longer matter."""
    if result.frozen_form:
        _say(args, f"frozen form: {result.frozen_form}")
    for finding in result.outside_allowed:
        _say(args, f"allowed to act outside the graph (--allow-op {finding.op}): "
                   f"{finding.line()}; never evaluated by a transform")
    for note in result.trust_notes:
        _say(args, f"trusted: {note}")
    for note in result.declared_inputs:
        _say(args, note)
    for name in result.unused_inputs:
        _say(args, f"input '{name}' no longer matters: no output reads it after optimization; "
                   "dropped from the optimized interface (verification fed the original a "
                   "stand-in value there)")


def _saved_model_from_output(args) -> bool:
    """``optimize -o DIR/`` or ``--output-format saved-model``: the output itself is a
    SavedModel (no .pb written). ``--output-format pb`` with ``-o DIR/``: exit 2."""
    from tfsurgery import api
    if args.command != "optimize":
        return False
    chosen = getattr(args, "output_format", None)
    if chosen == "pb" and api.wants_directory(args.output):
        raise api.InputError(f"-o {args.output} names a directory but --output-format pb writes "
                             "a file: give a file name, or --output-format saved-model")
    if chosen == "saved-model" and args.output is None:
        raise api.InputError("--output-format saved-model writes the directory -o names: "
                             "give -o DIR")
    return chosen == "saved-model" or (chosen is None and api.wants_directory(args.output))


def _saved_model_path(args) -> Optional[Path]:
    if getattr(args, "saved_model", None):
        return Path(args.saved_model)
    return Path(args.output) if _saved_model_from_output(args) else None


def _onnx_fusions(args):
    """--onnx-fusions as the export's ``fuse`` (a bad name: one line, exit 2)."""
    from tfsurgery import api
    return api.onnx_fusions(getattr(args, "onnx_fusions", "auto"))


def _onnx_path(args, source) -> Optional[Path]:
    from tfsurgery import api
    if args.command != "export":
        return Path(args.onnx) if args.onnx else None
    return Path(args.output) if args.output else api.default_onnx_path(source)


def _side_by_side(tf_summary: dict, exported) -> List[tuple]:
    """Rows (TF op, count, ONNX op, count), each side by count, node totals first."""
    def ranked(hist):
        return sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))
    left = [("nodes", tf_summary["nodes"])] + ranked(tf_summary["ops"])
    right = [("nodes", exported.node_count)] + ranked(exported.op_histogram)
    right += [("", "")] * (len(left) - len(right))
    left += [("", "")] * (len(right) - len(left))
    return [l + r for l, r in zip(left, right)]


def _inspect(args, source, transforms) -> int:
    from tfsurgery import api
    _outside_listed(args, source.label, api.outside_ops(source, _interface(args)))
    result = api.optimize(source, transforms, interface=_interface(args),
                          checks=_checks(args, verify=False), options=_options(args))
    hist = api.op_histogram(source.graph_def)
    _say(args, f"{source.label}: {len(source.graph_def.node)} nodes, "
               f"{source.graph_def.ByteSize()} bytes")
    _say(args, f"inputs:  {', '.join(result.inputs) or '(none)'}")
    _say(args, f"outputs: {', '.join(result.outputs)}")
    _say(args, f"training flags: {', '.join(result.training_flags) or '(none)'}")
    _say(args, api.format_table(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])),
                                headers=("op", "count")))
    _say(args, "dry run — what each transform would change:")
    for line in api.transform_lines(result.reports, verbose=args.verbose):
        _say(args, line)
    _interface_notes(args, result)
    if args.report_json:
        api.write_json(args.report_json, result.as_report(), input_path=source.path)
    if args.picture:
        api.draw(source, result, args.picture, scope=args.picture_scope)
        _say(args, f"wrote {args.picture}")
    return 0


def _inspect_unloaded(args, scanned) -> int:
    """inspect of a SavedModel or Keras file without --load: its protos, read, not loaded."""
    _say(args, f"{scanned.label}: not loaded (--load loads it, which runs its initializers, "
               "and dry-runs the transforms)")
    for line in scanned.lines:
        _say(args, line)
    _outside_listed(args, scanned.label, scanned.findings)
    return 0


def _lists_outside_ops(args, refused) -> None:
    """inspect of a SavedModel refused while loading: its nodes, listed (it was not loaded)."""
    from tfsurgery import api
    findings = [f for f in refused.findings if isinstance(f, api.outside.Finding)]
    if findings:
        _say_outside(args, findings)


def _outside_listed(args, label, findings) -> None:
    """inspect: every node that may not run, found without running anything, each allowed or
    refused; ``UnsafeModel`` (exit 2: no dry run, it would run the graph's constant parts)
    when some are refused."""
    from tfsurgery import api
    if not findings:
        _say(args, "may run: everything (stateless or reviewed ops; nothing reaching files, "
                   "servers or Python)")
        return
    refused = _say_outside(args, findings)
    if refused:
        raise api.UnsafeModel(api.outside.refusal(label, refused), findings=refused)


def _say_outside(args, findings) -> list:
    """Each node that may not run, allowed or refused; the refused ones."""
    from tfsurgery import api
    allowed = api.outside.allowed()
    for finding in findings:
        verdict = "allowed (--allow-op)" if finding.op in allowed else "refused"
        _say(args, f"may not run: {finding.line()} — {verdict}")
    return [f for f in findings if f.op not in allowed]


def _compare(args) -> int:
    """``compare A B``: 0 when every compared tensor is within the tolerance, else 1."""
    from tfsurgery import api
    compared = api.compare(args.a, args.b, inputs=_split(args.inputs),
                           outputs=_split(args.outputs), feeds=dict(args.feed),
                           input_shapes=dict(args.input_shape), samples=args.samples,
                           tolerance=args.tolerance, timeout=args.verify_timeout,
                           allow_ops=args.allow_op, trust=args.trust_model,
                           imports=args.imports)
    for line in compared.lines():
        _say(args, line)
    if args.report_json:
        api.write_json(args.report_json, compared.as_dict(), input_path=args.a)
    if not compared.passed:
        first = compared.first or compared.worst
        where = f": first divergence {first.name}" if first else ""
        print(f"tfsurgery: {args.b} differs from {args.a}{where}", file=sys.stderr)
        return 1
    return 0


def _batch(args) -> int:
    """``batch IN_DIR -o OUT_DIR``: the optimize options checked here first (transform names,
    plugins, preprocessing: exit 2 before any model runs), then one line per model as it
    finishes and the summary table."""
    from tfsurgery import api
    options = args.optimize
    if options.list_transforms:
        raise api.InputError("batch: --list-transforms optimizes nothing (tfsurgery optimize "
                             "--list-transforms lists them)")
    if not args.openvino:            # --openvino-precision alone: one line
        _check_openvino_request(api, options)
    api.load_plugins(options.plugin)
    api.import_modules(options.imports)          # one that cannot be imported: exit 2 here
    api.choose_transforms(_split(options.transforms), bn_fold=options.bn_fold,
                          enable=options.enable, disable=options.disable)
    _preprocess(options)

    def finished(record):
        why = f": {record['error']}" if record["error"] else ""
        _say(args, f"{record['model']}: {record['status']} ({record['seconds']:.1f} s){why}")

    summary = api.batch.run(
        options.input, args.output, args.optimize_argv,
        exports=[name for name in api.batch.EXPORTS if getattr(args, name)], jobs=args.jobs,
        timeout=args.model_timeout or api.batch.DEFAULT_TIMEOUT, engine=args.engine,
        ray_address=args.ray_address, shared_output=args.ray_shared_output, on_done=finished)
    _say(args, api.batch.format_summary(summary))
    return api.batch.exit_status(summary)
