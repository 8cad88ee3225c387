"""--int8-target: the settings per CPU, from given machine names and /proc/cpuinfo texts (never
from the CPU the tests run on), applied by onnxruntime's own quantize_static and checked in
onnxruntime against the float model; and the int8 speed check (its refusal path only: no
timing is ever asserted)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tfsurgery.int8 import speed as int8_speed
from tfsurgery.int8 import target as int8_target
from tfsurgery.int8.backends import onnx as quantize
from tfsurgery.errors import InputError
from tfsurgery.verify.samples import Samples

VNNI_CPU = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n"
AVX2_CPU = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n"
AMX_CPU = "model name\t: Intel Xeon\nflags\t\t: avx2 avx512f amx_tile amx_int8 avx_vnni\n"


@pytest.mark.parametrize("machine, cpuinfo, target, activations, reduce_range", [
    ("x86_64", VNNI_CPU, "x86-vnni", "uint8", False),
    ("x86_64", AMX_CPU, "x86-vnni", "uint8", False),
    ("x86_64", AVX2_CPU, "x86", "uint8", True),
    ("AMD64", AVX2_CPU, "x86", "uint8", True),
    ("aarch64", "", "arm", "int8", False),
    ("arm64", "", "arm", "int8", False),
])
def test_auto_reads_the_machine_and_its_flags(machine, cpuinfo, target, activations,
                                              reduce_range):
    chosen = int8_target.settings("auto", machine=machine, cpuinfo=cpuinfo)
    assert (chosen.target, chosen.activations, chosen.weights, chosen.per_channel,
            chosen.reduce_range) == (target, activations, "int8", True, reduce_range)
    assert machine in chosen.why and chosen.target in chosen.summary


def test_unreadable_cpuinfo_and_unknown_machines_fall_back_plainly(monkeypatch, tmp_path):
    monkeypatch.setattr(int8_target, "CPUINFO", str(tmp_path / "missing"))
    x86 = int8_target.settings("auto", machine="x86_64")
    assert (x86.target, x86.reduce_range) == ("x86", True)
    assert "cannot be read" in x86.why
    other = int8_target.settings("auto", machine="ppc64le", cpuinfo="")
    assert other.activations == "int8" and "neither x86 nor ARM" in other.why


def test_a_named_target_overrides_this_machine():
    chosen = int8_target.settings("arm", machine="x86_64", cpuinfo=VNNI_CPU)
    assert (chosen.target, chosen.activations) == ("arm", "int8")
    assert "asked for" in chosen.why
    with pytest.raises(InputError, match="--int8-target riscv: choose from auto, x86"):
        int8_target.settings("riscv")


@pytest.mark.parametrize("target, alternatives", [
    ("x86", ["7-bit per-tensor", "8-bit per-channel", "8-bit per-tensor"]),
    ("x86-vnni", ["8-bit per-tensor"]), ("arm", ["8-bit per-tensor"])])
def test_each_target_names_onnxruntimes_defaults_it_differs_from(target, alternatives):
    """The weight settings the int8 loop measures beside the target's guidance: each of
    onnxruntime's defaults (8 bits, per tensor) the guidance differs from, activations kept."""
    guided = int8_target.settings(target)
    others = guided.weight_alternatives()
    assert [o.weights_label for o in others] == alternatives
    assert all((o.target, o.activations) == (guided.target, guided.activations) for o in others)
    assert guided.weights_label == ("7-bit per-channel" if target == "x86" else
                                    "8-bit per-channel")
    assert others[-1].quantize_dynamic_options()["per_channel"] is False
    assert others[-1].quantize_static_options()["reduce_range"] is False


def test_cpu_name_names_the_model_and_int8_flags():
    assert int8_target.cpu_name(VNNI_CPU) == "AMD EPYC (avx2, avx512f, avx512_vnni)"
    assert int8_target.cpu_name(AVX2_CPU) == "AMD EPYC (avx2)"


# ---------------------------------------------------------------- applied by quantize_static
def _float_model(path, rng):
    """input x:0 (named as tf2onnx names it) [1, 3, 8, 8] → Conv 3×3 (6 channels) → Relu → Conv 1×1 (4) → output, random."""
    w1 = numpy_helper.from_array(rng.normal(0, 0.5, (6, 3, 3, 3)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.normal(0, 0.1, 6).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.5, (4, 6, 1, 1)).astype(np.float32), "w2")
    b2 = numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "b2")
    nodes = [helper.make_node("Conv", ["x:0", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(
        "x:0", TensorProto.FLOAT, [1, 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, 8, 8])], [w1, b1, w2, b2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def _quantized(tmp_path, target):
    rng = np.random.default_rng(7)
    float_model = _float_model(tmp_path / "float.onnx", rng)
    rows = Samples({"x": rng.uniform(-1, 1, (16, 3, 8, 8)).astype(np.float32)}, {"x": False},
                   "random rows")
    out = tmp_path / f"{target}.onnx"
    quantize._quantize_static(float_model, out, rows, [], cache=tmp_path / f"{target}.json",
                              settings=int8_target.settings(target))
    return float_model, out, rng


def _zero_point_types(model):
    inits = {i.name: i for i in model.graph.initializer}
    return {node.input[2]: inits[node.input[2]].data_type for node in model.graph.node
            if node.op_type == "QuantizeLinear"}


@pytest.mark.parametrize("target, activation_type, weight_limit", [
    ("x86-vnni", TensorProto.UINT8, 127), ("x86", TensorProto.UINT8, 64),
    ("arm", TensorProto.INT8, 127)])
def test_each_target_quantizes_as_it_says_and_stays_close_to_float(tmp_path, target,
                                                                   activation_type,
                                                                   weight_limit):
    float_model, int8_model, rng = _quantized(tmp_path, target)
    model = onnx.load(str(int8_model))
    assert set(_zero_point_types(model).values()) == {activation_type}   # activations
    weights = [numpy_helper.to_array(i) for i in model.graph.initializer
               if i.name.startswith(("w1", "w2")) and i.data_type == TensorProto.INT8
               and i.dims and len(i.dims) == 4]
    assert len(weights) == 2                                              # per-channel int8
    assert max(int(np.abs(w).max()) for w in weights) <= weight_limit     # 7 bits: reduce_range
    scales = [i for i in model.graph.initializer if i.name.startswith("w1") and
              i.data_type == TensorProto.FLOAT and len(i.dims) == 1]
    assert scales and scales[0].dims[0] == 6                              # one scale a channel
    x = rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)
    expected = ort.InferenceSession(str(float_model), providers=["CPUExecutionProvider"]) \
        .run(None, {"x:0": x})[0]
    # the target's arithmetic, on every CPU: the QDQ model in onnx's numpy reference —
    # dequantized integers multiplied and summed exactly, as an int32 accumulation without
    # saturation computes them (VNNI, ARM's dot products; 7-bit weights on any x86)
    reference = integer_reference(int8_model, {"x:0": x})
    assert relative_error(reference, expected) < 0.05
    # onnxruntime's own kernels only where they are the target's: a VNNI/ARM artefact run by
    # an AVX2-only CPU's u8×s8 kernels saturates (issue 47), which says nothing of the artefact
    if runs_as_its_target_here(target):
        got = ort.InferenceSession(str(int8_model), providers=["CPUExecutionProvider"]) \
            .run(None, {"x:0": x})[0]
        assert relative_error(got, expected) < 0.05
        assert relative_error(got, reference) < 0.01


def relative_error(got, expected) -> float:
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


def integer_reference(path, feeds):
    """The quantized model's outputs in onnx's reference evaluator (numpy), at an opset whose
    DequantizeLinear it implements (19+: the same semantics for int8/uint8/int32)."""
    from onnx.reference import ReferenceEvaluator
    model = onnx.load(str(path))
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, 21)
    return ReferenceEvaluator(model).run(None, feeds)[0]


def runs_as_its_target_here(target: str) -> bool:
    """Does this CPU's onnxruntime compute ``target``'s artefact as its target would: the
    target detected here, or 7-bit weights (``x86``) on any x86 — they never saturate."""
    here, _ = int8_target.detect()
    return here == target or (target == "x86" and here.startswith("x86"))


def test_the_integer_reference_sees_a_wrong_weight(tmp_path):
    """The reference can fail: one weight of the int8 model 5% off (by the largest weight's
    step count) moves its output off the exact model's."""
    float_model, int8_model, rng = _quantized(tmp_path, "x86-vnni")
    x = rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)
    before = integer_reference(int8_model, {"x:0": x})
    model = onnx.load(str(int8_model))
    [weights] = [i for i in model.graph.initializer if i.name.startswith("w1")
                 and i.data_type == TensorProto.INT8 and len(i.dims) == 4]
    values = numpy_helper.to_array(weights).copy()
    at = np.unravel_index(np.abs(values.astype(np.int32)).argmax(), values.shape)
    values[at] = int(round(values[at] * 0.95))
    weights.CopyFrom(numpy_helper.from_array(values, weights.name))
    onnx.save(model, str(tmp_path / "wrong.onnx"))
    after = integer_reference(tmp_path / "wrong.onnx", {"x:0": x})
    assert relative_error(after, before) > 1e-3


# ---------------------------------------------------------------- the speed check
def test_speed_is_measured_and_an_impossible_minimum_refuses(tmp_path):
    float_model, int8_model, rng = _quantized(tmp_path, "x86-vnni")
    feeds = {"x": rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)}
    speed = int8_speed.measure(float_model, int8_model, feeds, runs=3, min_speedup=1000)
    assert speed.float_ms > 0 and speed.int8_ms > 0 and speed.runs == 3
    assert speed.speedup == pytest.approx(speed.float_ms / speed.int8_ms)
    assert not speed.passed and speed.as_dict()["passed"] is False
    with pytest.raises(int8_speed.Int8TooSlow, match="below --int8-min-speedup 1000"):
        int8_speed.require(speed)


def test_a_slower_int8_is_said_loudly():
    slow = int8_speed.Speed(5.0, 6.0, 0.1, 0.1, runs=5, threads=2, cpu="some CPU")
    assert slow.line().startswith("WARNING: int8 is NOT faster than float")
    assert "0.83×" in slow.line() and slow.passed            # no minimum asked: not refused
    fast = int8_speed.Speed(6.0, 3.0, 0.1, 0.1, runs=5, threads=2, cpu="some CPU")
    assert fast.line().startswith("int8 speed-up 2.00×")


@pytest.mark.parametrize("bad", [-0.5, -1.5, float("nan")])
def test_a_minimum_speedup_must_be_zero_or_more(bad):
    """0 is allowed (int8 for its size, speed reported only); the default is 1.0."""
    with pytest.raises(InputError, match="--int8-min-speedup"):
        int8_speed.check_min_speedup(bad)
    int8_speed.check_min_speedup(0)
    assert int8_speed.MIN_SPEEDUP == 1.0
    slow = int8_speed.Speed(5.0, 6.0, 0.1, 0.1, runs=5, threads=2, cpu="some CPU",
                            min_speedup=0)
    assert slow.passed and "written for its size only (--int8-min-speedup 0)" in slow.line()


def test_cpuinfo_is_read_in_one_place_for_x86_and_arm():
    """int8_target reads /proc/cpuinfo for every module (runtime_bench names the CPU with it):
    x86's "flags", ARM's "Features" where asked."""
    arm = "processor : 0\nFeatures : fp asimd asimddp i8mm\nCPU implementer : 0x41\n"
    assert int8_target.cpu_flags(arm) == set()
    assert int8_target.cpu_flags(arm, arm=True) == {"fp", "asimd", "asimddp", "i8mm"}
    assert int8_target.cpuinfo_value(VNNI_CPU, "model name") == "AMD EPYC"
    assert int8_target.cpuinfo_value(arm, "model name") == ""
