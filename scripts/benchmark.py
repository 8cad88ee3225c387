"""Benchmark tfsurgery against optimize_for_inference_lib and offline Grappler.

    python scripts/benchmark.py                      # everything -> docs/benchmark.{md,json}
    python scripts/benchmark.py --quick              # small models, no 200k-node run
    python scripts/benchmark.py --models ResNet50 --repeats 5 --training-ops
    python scripts/benchmark.py --peer-graphs       # only the peer simplification cases (~10 s)
    python scripts/benchmark.py --layout            # only NCHW vs --layout NHWC, printed

The logic lives in benchmarks/harness.py (a development tool, not installed); this file only parses options and writes the results.
"""
import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness as benchmark  # noqa: E402
from benchmarks.common import splice_section  # noqa: E402
from tfsurgery import io  # noqa: E402
from tfsurgery.export import onnx as onnx_export


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None,
                        help=f"comma-separated, from {', '.join(benchmark.MODELS)} (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help=f"only {', '.join(benchmark.QUICK_MODELS)}; scaling to 20k nodes")
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats (median)")
    parser.add_argument("--input-size", type=int, default=224,
                        help="Keras applications' input size (default 224, ImageNet's)")
    parser.add_argument("--opset", type=int, default=onnx_export.DEFAULT_OPSET)
    parser.add_argument("--grappler-optimizers", default=",".join(benchmark.GRAPPLER_OPTIMIZERS),
                        help="Grappler optimizers for the peer (default: %(default)s)")
    parser.add_argument("--no-scaling", action="store_true", help="skip the synthetic scaling run")
    parser.add_argument("--training-ops", action="store_true",
                        help="also run benchmarks.training.adam_step_benchmark")
    parser.add_argument("--training-repeats", type=int, default=10)
    parser.add_argument("--deploy-runs", type=int, default=20,
                        help="timed runs per runtime (TF, onnxruntime, TFLite) of the deployment "
                             "artefacts; 0 skips the artefact sizes and latencies")
    parser.add_argument("--localize", action="store_true",
                        help="only time localizing a failed check (a BN fold broken on purpose) "
                             "against verification, on --models (benchmarks/localize.py)")
    parser.add_argument("--mutation-sweep", action="store_true",
                        help="only the mutation sweep on --models: each weight layer x1.05 by a "
                             "user's transform, caught / total per model, printed "
                             "(benchmarks/mutation_sweep.py)")
    parser.add_argument("--mutation-limit", type=int, default=8,
                        help="layers mutated per model in --mutation-sweep, spread from the "
                             "first to the last (0: every one; default 8)")
    parser.add_argument("--layout", action="store_true",
                        help="only time an NCHW ResNet-style graph against its --layout NHWC "
                             "result, oneDNN on and off (benchmarks/layout.py)")
    parser.add_argument("--int8", action="store_true",
                        help="also time our float ONNX, its static int8 and onnxruntime's "
                             "recommended int8 recipe (ResNet50, MobileNetV2) in onnxruntime")
    parser.add_argument("--int8-only", action="store_true",
                        help="only that int8 timing (benchmarks/int8.py), printed")
    parser.add_argument("--int8-repeats", type=int, default=3,
                        help="int8 timing repeats, each in a fresh process (default 3)")
    parser.add_argument("--transformers", action="store_true",
                        help="only the transformer run (benchmarks/transformers.py): BERT-, "
                             "GPT-2-, DistilBERT-, ViT-style, BERT-base-size and the real "
                             "libraries' (Hugging Face, keras-hub) models in TF, onnxruntime "
                             "(tf2onnx, its transformer optimizer, ours fused and not, ours "
                             "unfused + the optimizer, dynamic int8), OpenVINO and TFLite; its "
                             "section of --out-md and key of --out-json are replaced")
    parser.add_argument("--transformer-models",
                        default="bert,gpt2,distilbert,vit,bert-base,hf-bert,hf-gpt2,hf-vit,"
                                "keras-hub-bert",
                        help="with --transformers: which (default: %(default)s; hf-bert-tiny: "
                             "a smoke run)")
    parser.add_argument("--simulate-cpu", choices=["avx2"], default=None,
                        help="with --transformers: measure as on an AVX2-only CPU where this "
                             "one cannot be that: TensorFlow's timed processes with oneDNN kept "
                             "to AVX2 (ONEDNN_MAX_CPU_ISA), the int8 target such a CPU gets "
                             "('x86': 7-bit weights by onnxruntime's guidance, measured against "
                             "8-bit), OpenVINO at f32 (its default without bf16); onnxruntime's "
                             "and OpenVINO's kernels still use this CPU's instructions, so their "
                             "speed is not simulated (issue 47)")
    parser.add_argument("--peer-graphs", action="store_true",
                        help="only the peer simplification cases (benchmarks/simplify.py): "
                             "their section of --out-md and key of --out-json are replaced, the "
                             "rest of both files is kept")
    parser.add_argument("--scaling", action="store_true",
                        help="only the scaling run (benchmarks.harness.scaling_run, this "
                             "machine's details with it): its section, its target rows and "
                             "machine line of --out-md, and its key of --out-json are replaced, "
                             "the rest of both files is kept")
    parser.add_argument("--peer-misses", type=Path, default=None,
                        help="with --peer-graphs: also write the list of cases where tfsurgery "
                             "has more nodes than Grappler to this Markdown file")
    parser.add_argument("--out-md", type=Path, default=ROOT / "docs" / "benchmark.md")
    parser.add_argument("--out-json", type=Path, default=ROOT / "docs" / "benchmark.json")
    args = parser.parse_args(argv)
    default = benchmark.QUICK_MODELS if args.quick else benchmark.MODELS
    args.models = args.models.split(",") if args.models else list(default)
    unknown = [m for m in args.models if m not in benchmark.MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(benchmark.MODELS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.localize:
        from benchmarks import localize
        rows = [localize.measure(name, benchmark.build_model(name, args.input_size))
                for name in args.models]
        print(localize.render(rows))
        return 0
    if args.mutation_sweep:
        return mutation_sweep(args)
    if args.peer_graphs:
        return peer_graphs(args)
    if args.transformers:
        return transformers_only(args)
    if args.scaling:
        return scaling_only(args)
    if args.int8_only:
        print(int8_markdown(args)[1])
        return 0
    if args.layout:
        from benchmarks import layout
        print(layout.render(layout.measure(runs=max(args.deploy_runs, 5))))
        return 0
    blocks = () if args.no_scaling else (
        benchmark.QUICK_SCALING_BLOCKS if args.quick else benchmark.SCALING_BLOCKS)
    result = benchmark.run(args.models, repeats=args.repeats, input_size=args.input_size,
                           opset=args.opset, scaling_blocks=blocks,
                           grappler_optimizers=args.grappler_optimizers.split(","),
                           training_ops=args.training_ops,
                           training_repeats=args.training_repeats,
                           deploy_runs=args.deploy_runs,
                           log=lambda line: print(f"[benchmark] {line}", file=sys.stderr,
                                                  flush=True))
    markdown = benchmark.render_markdown(result)
    if args.int8:
        result["int8"], section = int8_markdown(args)
        markdown += "\n" + section
    markdown, result = keep_peer_section(args, markdown, result)
    print(markdown)
    write_all([(args.out_md, markdown), (args.out_json, as_json(result))])
    return 0


def int8_markdown(args):
    """float ONNX, tfsurgery's int8 and onnxruntime's recipe timed together (benchmarks/int8.py)
    on ResNet50 and MobileNetV2 (or --models when given)."""
    from benchmarks import int8
    names = [n for n in args.models if n in ("ResNet50", "MobileNetV2")] or \
        ["ResNet50", "MobileNetV2"]
    sections = {}
    for name in names:
        print(f"[benchmark] int8: {name}", file=sys.stderr, flush=True)
        sections[name] = int8.int8_section(benchmark.build_model(name, args.input_size),
                                           runs=max(args.deploy_runs, 5),
                                           repeats=args.int8_repeats)
    return sections, int8.render(sections)


def transformers_only(args) -> int:
    """Measure the transformer run; splice its section and JSON key into the existing files."""
    from benchmarks import transformers
    if args.simulate_cpu:
        simulate_cpu(args.simulate_cpu)
    result = transformers.run(args.transformer_models.split(","),
                              runs=max(args.deploy_runs, 5),
                              log=lambda line: print(f"[benchmark] {line}", file=sys.stderr,
                                                     flush=True))
    if args.simulate_cpu:
        result["simulated_cpu"] = args.simulate_cpu
    section = transformers.render(result)
    print(section)
    document, data = existing(args)
    data["transformers"] = result
    write_all([(args.out_md, splice_section(document, "## Transformers", section)),
               (args.out_json, as_json(data))])
    return 0


def simulate_cpu(kind: str) -> None:
    """What of an AVX2-only CPU can be had on another x86 (``--simulate-cpu avx2``): the int8
    target such a CPU is detected as; TensorFlow's timed processes with oneDNN kept to AVX2
    (only those: OpenVINO reads the same variable and then fails to build its bf16 kernels);
    OpenVINO's default precision timed as f32, which is its default without native bf16."""
    import contextlib

    from tfsurgery.bench import latency
    from tfsurgery.int8 import target
    assert kind == "avx2"
    target.detect = lambda *_args, **_kwargs: (
        "x86", "simulated AVX2-only CPU (scripts/benchmark.py --simulate-cpu avx2)")
    measure = latency.measure_in_subprocess

    @contextlib.contextmanager
    def isa(value):
        before = os.environ.get("ONEDNN_MAX_CPU_ISA")
        os.environ["ONEDNN_MAX_CPU_ISA"] = value
        try:
            yield
        finally:
            os.environ.pop("ONEDNN_MAX_CPU_ISA")
            if before is not None:
                os.environ["ONEDNN_MAX_CPU_ISA"] = before

    def as_on_avx2(runtime, variants, outputs, **options):
        if runtime == "openvino":
            options["precisions"] = {name: "f32" for name in variants}
        if runtime != "tensorflow":
            return measure(runtime, variants, outputs, **options)
        with isa("AVX2"):
            return measure(runtime, variants, outputs, **options)

    latency.measure_in_subprocess = as_on_avx2


def mutation_sweep(args) -> int:
    """Per model: how many single-layer weight errors (x1.05) verification catches."""
    from benchmarks.mutation_sweep import sweep
    from tfsurgery import api
    clean = True
    for name in args.models:
        built = benchmark.build_model(name, args.input_size)
        source = api.Source(built.graph_def, name, inputs=built.inputs, outputs=built.outputs,
                            training_flags=[built.training_flag] if built.training_flag else [])
        found = sweep(source, name, limit=args.mutation_limit or None)
        print(found.line(), flush=True)
        clean = clean and found.unmutated_passed and not found.misses
    return 0 if clean else 1


def peer_graphs(args) -> int:
    """Measure the peer cases; splice their section and JSON key into the existing files."""
    from benchmarks import simplify
    result = simplify.run(log=lambda line: print(f"[benchmark] {line}", file=sys.stderr,
                                                  flush=True))
    section = simplify.render(result)
    print(section)
    document, data = existing(args)
    data["peer_graphs"] = result
    outputs = [(args.out_md, simplify.splice(document, section)), (args.out_json, as_json(data))]
    if args.peer_misses:
        outputs.append((args.peer_misses, "# Peer simplification cases: misses\n\n"
                        + simplify.render_misses(result)))
    write_all(outputs)
    return 0


def scaling_only(args) -> int:
    """Measure the scaling run alone; splice its section, its target rows and a note of when and
    where it ran into the existing files."""
    blocks = benchmark.QUICK_SCALING_BLOCKS if args.quick else benchmark.SCALING_BLOCKS
    rows = benchmark.scaling_run(blocks, repeats=args.repeats)
    machine = benchmark.machine_info()
    section = benchmark.render_scaling(rows) + (
        f"\n\nMeasured alone (`python scripts/benchmark.py --scaling --repeats {args.repeats}`): "
        f"{machine['cpu']}, "
        f"{machine['cores']} cores; {machine['date']}; load average at start "
        f"{' / '.join(map(str, machine['load_average_at_start']))}.")
    print(section)
    document, data = existing(args)
    data["scaling"] = rows
    for check in benchmark.check_targets({"models": [], "scaling": rows}):
        document = benchmark.replace_target_row(document, check)
    document = splice_section(document, "## Scaling", section)
    write_all([(args.out_md, document), (args.out_json, as_json(data))])
    return 0


def existing(args):
    """The Markdown and JSON results a partial run splices into (empty ones if there are none)."""
    document = args.out_md.read_text() if args.out_md.exists() else "# Benchmark\n"
    data = json.loads(args.out_json.read_text()) if args.out_json.exists() else {}
    return document, data


def as_json(data) -> str:
    return json.dumps(data, indent=2, default=str) + "\n"


def write_all(outputs) -> None:
    """Each (path, text), written atomically."""
    for path, text in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        io.write_atomically(path, text.encode())
        print(f"wrote {path}", file=sys.stderr)


def keep_peer_section(args, markdown: str, result: dict):
    """A full run does not measure the peer cases: it keeps their last section and JSON key."""
    from benchmarks import simplify
    if args.out_md.exists():
        kept = simplify.section_of(args.out_md.read_text())
        if kept:
            markdown = simplify.splice(markdown, kept)
    if args.out_json.exists():
        old = json.loads(args.out_json.read_text())
        if "peer_graphs" in old:
            result["peer_graphs"] = old["peer_graphs"]
    return markdown, result


if __name__ == "__main__":
    sys.exit(main())
