"""Smoke test of the benchmark logic on the article model: structure and node counts, no timing."""
import json

import pytest

from tfsurgery.models.tf1 import article_cnn
from benchmarks import harness as benchmark


@pytest.fixture(scope="module")
def result():
    row = benchmark.benchmark_model("article_cnn", article_cnn(), repeats=1)
    data = {"machine": benchmark.machine_info(), "models": [row], "scaling": [],
            "training_ops": None,
            "settings": {"repeats": 1, "input_size": 32, "opset": 18, "tolerance": 1e-4,
                         "grappler_optimizers": ["constfold", "arithmetic"]}}
    data["targets"] = benchmark.check_targets(data)
    return data


def variants(result):
    return result["models"][0]["variants"]


def test_every_variant_is_measured(result):
    rows = variants(result)
    assert set(rows) == set(benchmark.VARIANTS)
    # Every peer runs on the article model: a peer failing in the harness would silently drop
    # its row from every comparison, so it fails here instead (the harness still records a
    # peer's error on models it really cannot handle).
    failed = {name: row["error"] for name, row in rows.items() if "error" in row}
    assert failed == {}, failed
    for name, row in rows.items():
        assert row["nodes"] > 0 and "bn_total" in row["leftover"]
        assert row["max_error"] is not None
        assert name == "original" or row["seconds"] > 0
    assert result["models"][0]["floor_seconds"] > 0
    json.dumps(result, default=str)              # what --out-json writes


def test_original_has_what_tfsurgery_removes(result):
    left = variants(result)["original"]["leftover"]
    assert left["FusedBatchNorm*"] == 6 and left["Switch"] > 0 and left["RandomUniform"] == 3
    assert variants(result)["original"]["onnx"]["if"] == 6


def test_tfsurgery_row(result):
    row = variants(result)["tfsurgery"]
    assert row["leftover"]["bn_total"] == 0 and row["leftover"]["cond_dropout_total"] == 0
    assert row["nodes"] == 26
    assert row["max_error"] <= benchmark.TOLERANCE
    assert row["onnx"]["if"] == 0
    assert row["onnx"]["ort_basic_nodes"] <= 14 and row["onnx"]["nodes"] <= 15
    assert "fold-batch-norm" in row["transform_seconds"]


def test_targets_and_markdown(result):
    targets = {t["target"]: t for t in result["targets"]}
    article = [t for name, t in targets.items() if name.startswith("article_cnn")]
    assert len(article) == 5 and all(t["met"] for t in article)   # incl. fewer nodes than Grappler
    text = benchmark.render_markdown(result)
    assert "### article_cnn" in text and "| tfsurgery | 26 | 0 | 0 |" in text
    assert result["machine"]["cpu"] in text


def test_training_section_renders_any_dict():
    section = {"n_tensors": 2, "median_seconds": {"fused": 0.1, "onnx": 0.2},
               "ratio_to_fused": {"onnx": 2.0}}
    text = benchmark.render_training(section)
    assert "| fused | 0.1 | – |" in text and "| onnx | 0.2 | 2 |" in text
    assert "Not run" in benchmark.render_training({"error": "missing"})


def test_deployment_section_on_the_article_model():
    from benchmarks import deploy
    from tfsurgery.export import openvino as openvino_export
    section = deploy.deployment(article_cnn(seed=2), runs=3)
    # OpenVINO (float32 weights): f32 always, bf16 where this CPU runs it natively
    openvino = set()
    if openvino_export.installed():
        openvino = {f"openvino {p}" for p in deploy.OPENVINO_PRECISIONS
                    if p in openvino_export.supported_precisions()}
    for weights in deploy.WEIGHTS:
        row = {k: v for k, v in section["artefacts"][weights].items() if "error" not in v}
        assert set(row) == set(deploy.FORMATS) | (openvino if weights == "float32" else set())
        assert all(entry["passed"] and entry["bytes"] > 0 for entry in row.values()), row
    sizes = {w: section["artefacts"][w]["tflite"]["bytes"] for w in deploy.WEIGHTS}
    assert sizes["float16"] < sizes["float32"]
    timed = {k: t for k, t in section["latency"].items() if "error" not in t}
    assert set(timed) == {"tensorflow", "onnxruntime", "tflite"} | openvino
    assert all(t["median_ms"] > 0 for t in timed.values()), section["latency"]
    text = deploy.render("article_cnn", section)
    assert "| tflite | float16 |" in text and "| onnxruntime |" in text
    if openvino:
        assert "| openvino f32 | float32 |" in text and "f32 0.001" in text


def test_localization_timing_names_the_broken_fold():
    """benchmarks/localize.py (scripts/benchmark.py --localize): the broken BN fold is found and
    both times are measured (their ratio is the benchmark's figure, not asserted here)."""
    from benchmarks import localize
    row = localize.measure("article_cnn", article_cnn())
    assert row["transform"] == "fold-batch-norm" and row["node"]
    assert row["verification_seconds"] > 0 and row["localize_seconds"] > 0
    assert "article_cnn" in localize.render([row])


def test_scaling_only_rewrites_its_section_and_rows_and_keeps_the_rest():
    """`scripts/benchmark.py --scaling` splices a re-measured scaling section and its target rows
    into the document; every other line stays as it was."""
    from benchmarks.common import splice_section
    document = ("# Benchmark\n\n## Targets\n\n| target | measured | |\n| --- | --- | --- |\n"
                "| ResNet50: ≤ 300 TF nodes | 281 | met |\n"
                "| scaling: 22 nodes at ≤ 15× the parse+serialize time per node | 9.0× | met |\n\n"
                "## Scaling\n\nold table\n\n## Training ops\n\nkept\n")
    rows = [{"blocks": 1, "nodes": 22, "nodes_after": 4, "seconds": 2.0, "us_per_node": 40.0,
             "floor_seconds": 0.1, "floor_us_per_node": 2.0}]
    for check in benchmark.check_targets({"models": [], "scaling": rows}):
        document = benchmark.replace_target_row(document, check)
    document = splice_section(document, "## Scaling", benchmark.render_scaling(rows))
    assert "| scaling: 22 nodes at ≤ 15× the parse+serialize time per node | 20.0× | " \
           "**missed** |" in document
    assert "| ResNet50: ≤ 300 TF nodes | 281 | met |" in document
    assert "old table" not in document and "| 1 | 22 | 4 |" in document
    assert document.endswith("## Training ops\n\nkept\n")
    assert splice_section("# B\n", "## New", "## New\n\nx") == "# B\n\n## New\n\nx\n"


def test_transformer_section_renders_the_recipe_beside_the_default_and_tflite():
    """Issue 48's rows, on a section shaped as benchmarks/transformers.py records it (no model
    built, nothing timed): the default against `none + ort optimizer` per batch, the fused ops
    each wrote, TFLite's row, and a failed row with its reason."""
    from benchmarks import transformers
    ms = {transformers.DEFAULT: 2.0, transformers.RECIPE: 3.0, transformers.TFLITE: 1.5,
          "tf2onnx": 4.0}
    section = {"model": "hf-bert", "params": dict(layers=4, hidden=256, heads=4, seq=128),
               "runs": 5, "tf_nodes": {"original": 900, "optimized": 400},
               "onnx": {transformers.DEFAULT: {"nodes": 90, "fused_ops": {"Attention": 4,
                                                                          "BiasGelu": 4}},
                        transformers.RECIPE: {"nodes": 120,
                                              "fused_ops": {"SkipLayerNormalization": 9}},
                        transformers.TFLITE: {"check_max_error": 2e-7},
                        "tf2onnx + ort optimizer": {"failed": "InvalidGraph: Erfc"}},
               "batches": {1: {"median_ms": ms, "errors": {}},
                           4: {"median_ms": {k: 3 * v for k, v in ms.items()}, "errors": {}}}}
    text = "\n".join(transformers._render_model(section))
    assert "(its ms / ours): batch 1 1.50×, batch 4 1.50×" in text, text
    assert "tfsurgery default: 4 Attention, 4 BiasGelu" in text
    assert "the recipe: 9 SkipLayerNormalization" in text
    tflite = next(line for line in text.splitlines() if line.startswith("| TFLite"))
    assert "1.50" in tflite and "2.0e-07" in tflite
    assert "InvalidGraph: Erfc" in text
    assert transformers.ort_model_type("hf-gpt2") == "gpt2"
    assert transformers.ort_model_type("vit") == "vit" and transformers.ort_model_type("bert") \
        == "bert"


def test_the_mutation_sweep_section_prints_caught_over_total_per_model(capsys):
    """`scripts/benchmark.py --mutation-sweep --models article_cnn --mutation-limit 2`: the
    unmutated model passes, both mutations (the first and last weight layers ×1.05) are
    caught, and the line says so."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "scripts" / "benchmark.py"
    spec = importlib.util.spec_from_file_location("benchmark_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    code = script.main(["--mutation-sweep", "--models", "article_cnn", "--mutation-limit", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "article_cnn: mutation sweep caught 2/2" in out and "unmutated: passes" in out
