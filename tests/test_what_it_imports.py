"""Issue 47: what tfsurgery imports, its install brings. `.ci/run` runs the suite in a fresh
virtual environment (`pip install -e ".[test]"`, nothing else), so these tests see exactly what
the install put there: every module of the package imports, every optional path the CLI offers
finds what it imports — asserted, never skipped — and each package tfsurgery imports is required
by its install (or by the extra that names the option). A package missing anyway makes an export
one line naming it, exit 2, nothing written."""
import ast
import importlib
import importlib.metadata as metadata
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the installed package: tfsurgery, with the repository's transforms/ and models/ inside it
PACKAGES = {"tfsurgery": ROOT / "tfsurgery", "tfsurgery.transforms": ROOT / "transforms",
            "tfsurgery.models": ROOT / "models"}
# imported by a dependency, not by us, on a path we take: onnxruntime's transformer fusions
# (--onnx-fusions) run its symbolic shape inference, which imports sympy (issue 47)
NEEDED_THROUGH_OTHERS = {"sympy": "onnxruntime's transformer fusions (--onnx-fusions)"}
# where an import is optional: the extra whose option needs it ("" = install_requires)
EXTRA_OF = {"openvino": "openvino", "nncf": "openvino", "ray": "ray", "graphviz": "picture",
            "tf_keras": "test"}


def _modules(package: str, folder: Path):
    return [package] + [f"{package}.{info.name}" for info in
                        pkgutil.walk_packages([str(folder)], "")
                        if not info.name.endswith("__main__")]     # __main__ runs the CLI


def _third_party_imports(folder: Path):
    """Every module the source under ``folder`` imports that is neither ours nor the
    standard library's, lazily inside a function or not: name → the file importing it."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "tfsurgery":
                    found.setdefault(name, path.relative_to(ROOT))
    return found


def _required(extra: str = "") -> set:
    """The distributions ``pip install tfsurgery`` (with ``extra``) brings: install_requires (and
    the extra's), and theirs, recursively — read from the installed metadata."""
    from packaging.requirements import Requirement
    wanted, seen = [("tfsurgery", extra)], set()
    while wanted:
        dist, dist_extra = wanted.pop()
        key = _canonical(dist)
        if (key, dist_extra) in seen:
            continue
        seen.add((key, dist_extra))
        for line in _requires(dist):
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": dist_extra}):
                wanted.append((requirement.name, ""))
                wanted.extend((requirement.name, e) for e in requirement.extras)
    return {key for key, _ in seen}


def _requires(dist: str):
    """``dist``'s requirements as installed in this Python's site-packages (tfsurgery: not a
    stale tfsurgery.egg-info an earlier editable install left in the checkout)."""
    import sysconfig
    here = [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    found = next(iter(metadata.distributions(name=dist, path=here)), None) or \
        metadata.distribution(dist)
    return found.requires or []


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_module_of_the_installed_package_imports(package):
    modules = _modules(package, PACKAGES[package])
    assert len(modules) > 3, modules
    for name in modules:
        importlib.import_module(name)


def test_every_package_tfsurgery_imports_is_installed_by_what_it_offers():
    """The imports of tfsurgery/ and transforms/ (models/: the test builders) — and sympy, which
    onnxruntime's fusions import for us — come from a distribution the install requires, or the
    extra of the option that needs them; the test extra covers all of them, so CI runs them."""
    imports = {**_third_party_imports(ROOT / "tfsurgery"),
               **_third_party_imports(ROOT / "transforms")}
    tops = {name.split(".")[0] for name in imports} | set(NEEDED_THROUGH_OTHERS)
    assert {"onnxruntime", "tf2onnx", "ai_edge_litert", "scipy", "sympy"} <= tops, tops
    distributions = metadata.packages_distributions()
    core, test = _required(""), _required("test")
    for top in sorted(tops):
        assert top in distributions, f"{top}: imported by {imports.get(top, 'a dependency')} " \
                                     "but not installed"
        owners = {_canonical(d) for d in distributions[top]}
        extra = EXTRA_OF.get(top, "")
        assert owners & _required(extra), f"{top} ({owners}): not required by tfsurgery" + \
            (f"[{extra}]" if extra else "'s install_requires")
        assert owners & test, f"{top}: not in the test extra, so CI never runs its path"
    assert {"keras-hub", "transformers"} <= test and {"sympy", "scipy"} <= core


def test_every_optional_path_the_cli_offers_finds_its_imports():
    """Each option that imports something only when asked — asserted importable here, where
    the test extra was installed (a skip would hide exactly what issue 47 found)."""
    from tfsurgery import batch, picture
    from tfsurgery.export import openvino, tflite
    imports = _third_party_imports(ROOT / "tfsurgery")
    for name in sorted(imports):        # the lazy ones included (onnxruntime.transformers...)
        importlib.import_module(name)
    assert tflite.interpreter_class()[1] == "LiteRT interpreter"          # --tflite
    assert openvino.installed()                                          # --openvino
    importlib.import_module("nncf")                                      # --openvino --quantize
    assert batch.ray_available()                                         # batch --engine ray
    picture.check_available()                                            # --picture (+ dot)


def test_onnxruntimes_fusions_find_sympy():
    """--onnx-fusions: FusionSkipLayerNormalization builds this helper first; without sympy it
    raises — the crash of issue 47."""
    import onnx
    from onnx import TensorProto, helper
    from onnxruntime.transformers.shape_infer_helper import SymbolicShapeInferenceHelper
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", 4])
    result = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch_size", 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [value], [result]))
    onnx.checker.check_model(model)
    shapes = SymbolicShapeInferenceHelper(model)
    assert shapes.infer({"batch_size": 3}) and shapes.get_edge_shape("y") == [3, 4]


# ------------------------------------------------------------- a package missing anyway
def test_a_missing_package_is_named_from_what_import_said():
    from tfsurgery.errors import MissingPackage, missing_module
    try:
        importlib.import_module("no_such_package_i47.sub")
    except ImportError as error:
        assert missing_module(error) == "no_such_package_i47"
    try:                                   # onnxruntime's way: re-raised in words, from None
        try:
            raise ModuleNotFoundError("No module named 'sympy'", name="sympy")
        except ImportError:
            raise ImportError("sympy is required for symbolic shape inference") from None
    except ImportError as words:
        try:
            raise ImportError("helper unavailable") from words
        except ImportError as error:
            made = MissingPackage.of(error, "the ONNX export")
    assert made.package == "sympy" and "pip install sympy" in str(made)
    assert MissingPackage.of(ModuleNotFoundError("x", name="sklearn.datasets"), "it").package == \
        "scikit-learn"
    # "cannot import name" names a module that IS installed: not said to be missing
    vague = MissingPackage.of(ImportError("cannot import name 'X' from 'numpy'", name="numpy"),
                              "it")
    assert vague.package is None and "cannot import name 'X'" in str(vague)


BERT = dict(layers=1, hidden=32, heads=2, seq=8)


@pytest.fixture(scope="module")
def bert_pb(tmp_path_factory):
    from tfsurgery.models.transformers import frozen
    path = tmp_path_factory.mktemp("bert") / "bert.pb"
    path.write_bytes(frozen("bert", **BERT).graph_def.SerializeToString())
    return path


def test_an_export_missing_a_package_says_which_in_one_line(bert_pb, tmp_path):
    """Issue 47's crash, with sympy made unimportable in the CLI's process: exit 2, one line
    naming the package to install, no traceback, nothing written. (--no-verify: the graphs'
    check is not what this is about, and skipping it saves half the run.)"""
    out = tmp_path / "x.onnx"
    code = ("import sys; sys.modules['sympy'] = None\n"
            "from tfsurgery.cli import main\n"
            f"sys.exit(main(['export', {str(bert_pb)!r}, '-o', {str(out)!r}, '-q',"
            " '--onnx-fusions', 'all', '--no-verify']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    lines = [line for line in run.stderr.splitlines() if line.startswith("tfsurgery")]
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and len(lines) == 1, run.stderr[-3000:]
    assert "'sympy'" in lines[0] and "pip install sympy" in lines[0] and "ONNX" in lines[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------- which CPU the run was on
XEON = ("model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 fma avx512f "
        "avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n")
EPYC_AVX2 = "model name\t: AMD EPYC 7B12\nflags\t\t: fpu sse4_2 avx avx2 fma\n"


def test_the_summary_line_names_the_cpu_kind_and_onednn_settings():
    import cpu
    xeon = cpu.describe(XEON, {"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert xeon.startswith("CPU: Intel(R) Xeon(R) Platinum 8480+ (AMX: avx2 fma avx512f "
                           "avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_int8)")
    assert xeon.endswith("TF_ENABLE_ONEDNN_OPTS=0, ONEDNN_MAX_CPU_ISA=unset")
    epyc = cpu.describe(EPYC_AVX2, {"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert "AMD EPYC 7B12 (AVX2-only: avx2 fma)" in epyc and "ONEDNN_MAX_CPU_ISA=AVX2" in epyc
    assert "\n" not in cpu.describe()                       # this machine's: one line
