"""The structure the architecture issue asked for: imports point down, one installed package,
a graph checked after every pass, drawing as an optional extra."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfsurgery import pipeline
from tfsurgery.cli import main
from tfsurgery.errors import StructureError
from tfsurgery.graph import Graph
from tfsurgery.contract import Options, TransformReport, transform

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"tfsurgery": "tfsurgery", "tfsurgery/graph": "tfsurgery.graph",
           "tfsurgery/cli": "tfsurgery.cli",
           "tfsurgery/training": "tfsurgery.training",
           "tfsurgery/trust": "tfsurgery.trust", "tfsurgery/verify": "tfsurgery.verify",
           "tfsurgery/export": "tfsurgery.export", "tfsurgery/int8": "tfsurgery.int8",
           "tfsurgery/int8/backends": "tfsurgery.int8.backends",
           "tfsurgery/bench": "tfsurgery.bench",
           "transforms": "tfsurgery.transforms",
           "models": "tfsurgery.models", "benchmarks": "benchmarks"}
# The subpackages by job (issue 42): their __init__ only names the entry points, so importing a
# module through its package (``from tfsurgery.verify import check``) is no edge to the package.
JOB_PACKAGES = {"tfsurgery.trust", "tfsurgery.verify", "tfsurgery.export", "tfsurgery.int8",
                "tfsurgery.int8.backends", "tfsurgery.bench"}
# Every module's floor, explicitly: a module may import its own floor or below, never above.
# 0 ground (errors, the graph index, op vocabulary, TF helpers, the transform contract, trust),
# 1 transforms, 2 pipeline/verify/report/export (and the demo/benchmark graph builders),
# 3 the API: the facade and the modules it stands on and re-exports (loading, the plan, the
# result, int8's entry points, the writer, bench), 4 the cli package, 5 `python -m tfsurgery`,
# 6 the development benchmarks. A key names a top-level module or subpackage, or one module
# of a subpackage ("int8.target") where it sits on another floor than its package. A new
# module must be placed here: an unknown one fails the test.
FLOORS = {
    0: {"tfsurgery", "errors", "ops", "graph", "tfsession", "constants", "interface", "contract",
        "image_layout", "cpu_layout", "verify.samples", "export.tensor_list_loops",
        "export.onnx_tidy", "export.onnx_splice", "progress", "_compat", "int8.target", "trust"},
    1: {"transforms"},
    2: {"pipeline", "verify", "report", "io", "export", "bench", "int8", "int8.backends",
        "picture", "preprocessing", "training", "models"},
    3: {"api", "source", "plan", "result", "int8.config", "export.writer", "export.exporters",
        "export.formats", "bench.command",
        "batch"},
    4: {"cli"},
    5: {"__main__"},
    6: {"benchmarks"},
}
GROUND = FLOORS[0]
# Inside the graph package (floor 0), one job per module, each importing only the ones before it:
# the input grammar, the op registry and tensor codec, the library, the structure proof, order
# and reachability, the index.
GRAPH_LAYERS = {"refs": 0, "opdefs": 1, "tensors": 1, "library": 1, "integrity": 2, "order": 3,
                "index": 4}


def floor(module: str) -> int:
    """The floor of a module; a subpackage's modules (tfsurgery.graph.index) share its floor."""
    parts = module.split(".")
    if parts[0] == "benchmarks":
        keys = ["benchmarks"]
    elif len(parts) == 1:
        keys = ["tfsurgery"]
    else:   # the most specific key first: int8.backends.onnx, int8.backends, int8
        keys = [".".join(parts[1:end]) for end in range(len(parts), 1, -1)]
    found = [level for key in keys for level, names in FLOORS.items() if key in names][:1]
    assert found, f"{module} is on no floor: place it in FLOORS"
    return found[0]


def library_modules():
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            yield name, path


def imports_of(path: Path):
    """Every module of ours a file imports, at module level or inside a function."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def import_graph():
    """Module → the modules of ours it imports. The bare package is no edge either way:
    ``from tfsurgery import x`` names the package only to reach x, and the package's own
    __init__ is the public facade, which imports its public names (the API included) on first
    use — everything else must respect the floors."""
    modules = dict(library_modules())
    return {name: sorted({target for target in imports_of(path) if target in modules
                          and target not in (name, "tfsurgery", *JOB_PACKAGES)})
            for name, path in modules.items() if name != "tfsurgery"}


def test_every_module_has_a_floor():
    for name in import_graph():
        floor(name)


def test_the_graph_package_is_ground_floor_split_by_job():
    """Every module of tfsurgery.graph is on floor 0, has its place in GRAPH_LAYERS, and imports
    only the modules below it (and nothing of ours above the ground floor); the package's
    __init__ only re-exports."""
    graph = import_graph()
    inside = {name.rsplit(".", 1)[1] for name in graph if name.startswith("tfsurgery.graph.")}
    assert inside == set(GRAPH_LAYERS)
    assert floor("tfsurgery.graph") == floor("tfsurgery.graph.integrity") == 0
    for module, layer in GRAPH_LAYERS.items():
        for target in graph[f"tfsurgery.graph.{module}"]:
            assert floor(target) == 0, (module, target)
            if target.startswith("tfsurgery.graph."):
                assert GRAPH_LAYERS[target.rsplit(".", 1)[1]] < layer, (module, target)
            else:
                assert target != "tfsurgery.graph", f"{module} imports the package facade"


def test_the_cli_goes_through_the_api_only():
    """The CLI parses, calls the API and prints: its modules import nothing of ours but the API
    and each other."""
    graph = import_graph()
    cli = {name for name in graph if name == "tfsurgery.cli" or name.startswith("tfsurgery.cli.")}
    assert {"tfsurgery.cli", "tfsurgery.cli.parser", "tfsurgery.cli.commands",
            "tfsurgery.cli.common", "tfsurgery.cli.bench", "tfsurgery.cli.int8_report"} <= cli
    for name in cli:
        assert set(graph[name]) <= cli | {"tfsurgery.api"}, name


def test_report_json_is_declared_once():
    """One shared parent parser gives every subcommand --report-json."""
    text = "".join(path.read_text() for path in (ROOT / "tfsurgery" / "cli").glob("*.py"))
    assert text.count('"--report-json"') == 1
    from tfsurgery.cli.parser import build_parser
    for command in (["optimize"], ["inspect"], ["export"], ["bench"], ["compare", "a", "b"]):
        args = build_parser().parse_args(command + ["--report-json", "r.json"])
        assert args.report_json == "r.json", command


def test_no_module_is_over_600_lines_and_the_api_is_a_facade():
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
             for _, path in library_modules()
             if path.is_relative_to(ROOT / "tfsurgery") or path.is_relative_to(ROOT / "transforms")}
    assert [name for name, size in sizes.items() if size > 600] == []
    assert sizes["tfsurgery/api.py"] <= 450


def test_the_readme_fits_a_screen_or_so():
    """The README: what it is, the two commands, a tour, the options, links — the depth is in
    docs/ (issue 34: at most 300 lines); every page it links exists."""
    import re
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)", text))
    assert linked and [page for page in linked if not (ROOT / page).is_file()] == []


def test_imports_point_down():
    upward = [(a, b) for a, targets in import_graph().items() for b in targets
              if floor(b) > floor(a)]
    assert upward == []


def test_import_graph_has_no_cycle():
    graph = import_graph()
    state = {}

    def visit(name, stack):
        state[name] = "open"
        for target in graph[name]:
            if state.get(target) == "open":
                pytest.fail(f"import cycle: {' -> '.join(stack + [name, target])}")
            if target not in state:
                visit(target, stack + [name])
        state[name] = "done"

    for name in graph:
        if name not in state:
            visit(name, [])


def test_library_code_never_loads_modules_from_strings():
    """Only one module imports by name: the user's own code, where the user names it (--plugin
    transforms, --import Keras layers); entry points come through importlib.metadata."""
    users = [str(path.relative_to(ROOT)) for _, path in library_modules()
             if {"importlib", "importlib.util"} & set(imports_of(path))]
    assert users == ["tfsurgery/trust/user_code.py"]


def test_only_tfsurgery_is_installed(tmp_path):
    """From another directory: tfsurgery.transforms/models import, bare transforms/models don't."""
    code = ("import importlib.util as u, tfsurgery.transforms, tfsurgery.models;"
            "print(u.find_spec('transforms'), u.find_spec('models'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "None"]


def test_transform_list_is_the_one_registry():
    from tfsurgery import transforms
    assert list(transforms.ORDER) == [fn.transform_name for fn in transforms.PIPELINE]
    defaults = [n for n in transforms.ORDER if transforms.REGISTRY[n].default]
    for opt_in in ("fold-batch-norm", "add-preprocessing", "float16-weights", "int8-weights"):
        assert opt_in not in defaults
    assert pipeline.resolve_transforms() == defaults
    assert pipeline.resolve_transforms(bn_fold=True) == [
        n for n in transforms.ORDER if n in defaults or n == "fold-batch-norm"]


# ---------------------------------------------------------------- a graph checked after every pass
def _graph_of(nodes):
    import tensorflow as tf
    graph_def = tf.compat.v1.GraphDef()
    for text in nodes:
        from google.protobuf import text_format
        graph_def.node.add().CopyFrom(text_format.Parse(text, tf.compat.v1.NodeDef()))
    return graph_def


CONST = 'name: "%s" op: "Const" attr { key: "dtype" value { type: DT_FLOAT } } ' \
        'attr { key: "value" value { tensor { dtype: DT_FLOAT tensor_shape {} float_val: 1 } } }'


def _chain():
    return _graph_of([CONST % "a",
                      'name: "b" op: "Identity" input: "a" attr { key: "T" value { type: DT_FLOAT } }',
                      'name: "c" op: "Neg" input: "b" attr { key: "T" value { type: DT_FLOAT } } '
                      'attr { key: "_class" value { list { s: "loc:@b" } } }'])


def test_removing_a_node_drops_colocation_references_to_it():
    import tensorflow as tf
    graph = Graph(_chain())
    graph.rewire("b", "a")
    graph.remove(["b"])
    assert graph.structure_problem() is None
    assert "_class" not in graph.node("c").attr
    with tf.Graph().as_default():
        tf.compat.v1.import_graph_def(graph.to_graph_def(), name="")      # TF accepts it


@pytest.mark.parametrize("breakage, message", [
    (lambda g: g.set_input("c", 0, "gone"), "no node 'gone'"),
    (lambda g: g.set_input("c", 0, "a:3"), "has 1 output"),
    (lambda g: g.set_input("b", 0, "c"), "cycle outside a while loop"),
])
def test_structure_problems_are_found(breakage, message):
    graph = Graph(_chain())
    assert graph.structure_problem() is None
    breakage(graph)
    assert message in graph.structure_problem()


def test_a_while_loop_is_not_a_broken_cycle():
    import tensorflow as tf
    with tf.Graph().as_default() as g:
        tf.compat.v1.disable_control_flow_v2()
        x = tf.compat.v1.placeholder(tf.float32, [], name="x")
        tf.compat.v1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2.0), [0, x])
        tf.compat.v1.enable_control_flow_v2()
    assert Graph(g.as_graph_def()).structure_problem() is None


@transform("break-the-graph")
def _break_the_graph(graph: Graph, options: Options) -> TransformReport:
    victim = next(n.name for n in graph if n.op == "Conv2D")
    graph.set_input(victim, 0, "no_such_node")
    return TransformReport("break-the-graph")


def test_a_broken_pass_stops_the_run_with_its_name_even_without_verify(
        monkeypatch, article_pb, tmp_path, capsys):
    monkeypatch.setitem(pipeline.REGISTRY, "break-the-graph", _break_the_graph)
    out = tmp_path / "out.pb"
    code = main([str(article_pb), "--transforms", "break-the-graph", "--no-verify", "-o", str(out)])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert "break-the-graph" in err and "no_such_node" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_the_pipeline_raises_structure_error_naming_the_pass(monkeypatch, article):
    monkeypatch.setitem(pipeline.REGISTRY, "break-the-graph", _break_the_graph)
    with pytest.raises(StructureError, match="transform 'break-the-graph' left a broken graph"):
        pipeline.run(article.graph_def, ["remove-identity", "break-the-graph"],
                     Options(inputs=list(article.inputs), outputs=list(article.outputs)))


def test_picture_without_graphviz_is_a_one_line_exit_2(monkeypatch, article_pb, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "graphviz", None)          # as if the extra is missing
    code = main([str(article_pb), "-o", str(tmp_path / "x.pb"), "--picture",
                 str(tmp_path / "p.svg")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "tfsurgery[picture]" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.pb").exists()


def test_the_transform_table_lists_every_transform_with_its_refusals():
    """The transform table (docs/transforms.md) has a row per registered transform saying what
    it refuses."""
    from tfsurgery import transforms
    section = (ROOT / "docs" / "transforms.md").read_text()
    rows = {line.split("`")[1]: line for line in section.splitlines() if line.startswith("| `")}
    assert set(transforms.ORDER) <= set(rows), set(transforms.ORDER) - set(rows)
    assert [n for n in transforms.ORDER if "efuse" not in rows[n]] == []


def test_the_house_is_by_job():
    """Issue 42: at most 22 top-level modules, none named by a job its subpackage owns (the
    subpackages are the rooms: docs/house.md)."""
    top = sorted(path.stem for path in (ROOT / "tfsurgery").glob("*.py"))
    assert len(top) <= 22, top
    rooms = {"trust", "verify", "export", "int8", "bench", "training", "graph", "cli"}
    owned = ("int8", "quantize", "onnx", "tflite", "openvino", "savedmodel", "export", "writer",
             "verify", "sensitivity", "localize", "latency", "bench", "outside", "trust")
    assert [name for name in top if name.startswith(owned)] == []
    assert all((ROOT / "tfsurgery" / room / "__init__.py").is_file() for room in rooms)
    house = (ROOT / "docs" / "house.md").read_text()
    assert all(f"tfsurgery/{room}/" in house for room in rooms - {"graph", "cli", "training"})
