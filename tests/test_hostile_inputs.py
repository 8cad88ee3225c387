"""Hostile inputs: every one exits 2 with exactly one line on stderr and no traceback, leaves the
input untouched and writes nothing — no output, no report, no stray temp file — and never hangs.

tests/test_cli.py already covers: missing file, empty file, a truncated .pb, a PNG renamed .pb, a
malformed .pbtxt, an empty directory, unknown --outputs/--inputs/--transforms, -o equal to the input
and -o into a missing directory. This file covers the rest:
  - broken graphs (duplicate names, missing/dangling inputs, unfrozen variables, no op, no nodes),
    as .pb and .pbtxt;
  - files that are not graphs, directories that are not SavedModels;
  - outputs that cannot be written (parent is a file, /proc, an existing directory, the report);
  - malformed but parseable graphs (bad ports, undecodable or wrongly-typed attributes, broken
    constants, unknown-rank inputs, outputs on dead cond branches) — found by the fuzzers;
  - two fuzzers: mutated bytes of the article's .pb through the loader, and structurally mutated
    article graphs through every transform.
"""
import os
import signal

import pytest
import tensorflow as tf
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import graph_pb2

from tfsurgery import io
from tfsurgery.cli import main
from tfsurgery.graph import Graph

HANG_SECONDS = 10          # a normal run of these small graphs takes about a second


# ---------------------------------------------------------------- helpers
def snapshot(directory):
    """Every file under ``directory`` (hidden temp files included) with its bytes."""
    found = {}
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, directory)] = handle.read()
    return found


def assert_rejected(argv, capsys, workdir, message=None):
    """``main(argv)`` exits 2 with one 'tfsurgery: error:' line and touches nothing in workdir."""
    before = snapshot(workdir)
    capsys.readouterr()
    crash = None
    with deadline(HANG_SECONDS) as clock:
        try:
            code = main([str(a) for a in argv])
        except Exception as error:          # a traceback reaches the user
            crash = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    if clock.expired:
        pytest.fail(f"still running after {HANG_SECONDS} s: an endless loop?")
    if crash:
        pytest.fail(f"crashed instead of exiting 2: {crash}")
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, (code, captured.err)
    assert len(lines) == 1 and lines[0].startswith("tfsurgery: error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    if message:
        assert message in lines[0], lines[0]
    assert snapshot(workdir) == before, "files were created, changed or removed"
    return lines[0]


class deadline:
    """Turn a hang into a test failure: SIGALRM interrupts the (main) test thread; the block is
    abandoned and ``expired`` is set. The interrupt is swallowed here, so no half-unwound frame
    ever reaches pytest's traceback printer."""

    def __init__(self, seconds):
        self.seconds, self.expired = seconds, False

    def _fire(self, signum, frame):
        raise _Expired()

    def __enter__(self):
        self.previous = signal.signal(signal.SIGALRM, self._fire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, kind, error, tb):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)
        if kind is _Expired:
            self.expired = True
            return True
        return False


class _Expired(BaseException):
    pass


def modified(graph_def, edit):
    copy = graph_pb2.GraphDef()
    copy.CopyFrom(graph_def)
    edit(copy)
    return copy


def add_node(graph_def, name, op, inputs=(), dtype=None):
    node = graph_def.node.add(name=name, op=op)
    node.input.extend(inputs)
    if dtype is not None:
        node.attr["dtype" if op in ("Const", "VariableV2", "VarHandleOp", "Placeholder")
                  else "T"].type = dtype.as_datatype_enum
    return node


def add_const(graph_def, name, value, dtype):
    node = add_node(graph_def, name, "Const", dtype=dtype)
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
    return node


def output_node(graph_def):
    return next(n for n in graph_def.node if n.name == "output")


@pytest.fixture
def work(tmp_path, article):
    """A directory holding the article model as good.pb; every test checks nothing appears here."""
    (tmp_path / "good.pb").write_bytes(article.graph_def.SerializeToString())
    return tmp_path


def write_graph(work, name, graph_def):
    path = work / name
    path.write_bytes(graph_def.SerializeToString())
    return path


# ---------------------------------------------------------------- broken graphs
def _duplicate(g):
    g.node.add().CopyFrom(next(n for n in g.node if n.op == "Conv2D"))


def _missing_input(g):
    output_node(g).input[0] = "no/such/node"


def _dangling_control(g):
    output_node(g).input.append("^ghost")


def _variable_v2(g):
    add_node(g, "w", "VariableV2", dtype=tf.float32)
    add_node(g, "w/read", "Identity", ["w"], dtype=tf.float32)


def _var_handle(g):
    handle = add_node(g, "v", "VarHandleOp", dtype=tf.float32)
    handle.attr["shared_name"].s = b"v"
    read = add_node(g, "v/Read/ReadVariableOp", "ReadVariableOp", ["v"])
    read.attr["dtype"].type = tf.float32.as_datatype_enum


def _no_op_type(g):
    g.node[1].op = ""


def _no_nodes(g):
    del g.node[:]


BROKEN_GRAPHS = {
    "duplicate node names": (_duplicate, "duplicate node name"),
    "input refers to a missing node": (_missing_input, "no/such/node"),
    "dangling control input": (_dangling_control, "ghost"),
    "unfrozen VariableV2": (_variable_v2, "variables"),
    "unfrozen VarHandleOp": (_var_handle, "variables"),
    "node without an op": (_no_op_type, "no op"),
    "GraphDef without nodes": (_no_nodes, "no nodes"),
}


@pytest.mark.parametrize("label", list(BROKEN_GRAPHS))
@pytest.mark.parametrize("fmt", ["pb", "pbtxt"])
def test_broken_graph_exits_2(label, fmt, work, article, capsys):
    edit, message = BROKEN_GRAPHS[label]
    graph_def = modified(article.graph_def, edit)
    path = work / f"broken.{fmt}"
    if fmt == "pb":
        path.write_bytes(graph_def.SerializeToString())
    else:
        from google.protobuf import text_format
        path.write_text(text_format.MessageToString(graph_def))
    assert_rejected([path, "--bn-fold"], capsys, work, message)
    # the Python API raises the same one-line InputError
    with pytest.raises(io.InputError, match=message):
        io.load_graph_def(path)


# ---------------------------------------------------------------- files that are not graphs
def _other_files(article):
    good = article.graph_def.SerializeToString()
    flipped = bytearray(good)
    flipped[0] = 0x0F                     # field 1 with wire type 7: not protobuf at all
    return {
        "corrupt wire type.pb": bytes(flipped),
        "garbage.pb": bytes(range(256)) * 4,
        "valid proto, wrong message.pb": tf.make_tensor_proto([1.0, 2.0]).SerializeToString(),
        "only versions.pb": graph_pb2.GraphDef(versions={"producer": 1}).SerializeToString(),
        "unknown field.pbtxt": b"node { name: 'a' op: 'Const' }\nnot_a_field: 3\n",
        "latin-1.pbtxt": "node { name: 'caf\xe9' op: 'Const' }".encode("latin-1"),
        "text named.pb": b"node { name: 'a' op: 'Const' }\n",
    }


@pytest.mark.parametrize("name", ["corrupt wire type.pb", "garbage.pb",
                                  "valid proto, wrong message.pb", "only versions.pb",
                                  "unknown field.pbtxt", "latin-1.pbtxt",
                                  "text named.pb"])
def test_file_that_is_not_a_graph_exits_2(name, work, article, capsys):
    path = work / name
    path.write_bytes(_other_files(article)[name])
    assert_rejected([path], capsys, work)


def test_directory_that_is_not_a_saved_model_exits_2(work, capsys):
    junk = work / "junk_dir"
    junk.mkdir()
    (junk / "readme.txt").write_text("not a model")
    (junk / "variables").mkdir()
    assert_rejected([junk, "--bn-fold"], capsys, work, "junk_dir")


def test_directory_with_a_corrupt_saved_model_pb_exits_2(work, capsys):
    fake = work / "fake_saved_model"
    fake.mkdir()
    (fake / "saved_model.pb").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    assert_rejected([fake], capsys, work, "fake_saved_model")


# ---------------------------------------------------------------- outputs that cannot be written
def test_output_whose_parent_is_a_file_exits_2(work, capsys):
    (work / "a_file").write_text("I am a file")
    assert_rejected([work / "good.pb", "-o", work / "a_file" / "out.pb"], capsys, work)


def test_output_into_proc_exits_2(work, capsys):
    """Root may write anywhere chmod forbids, but not into /proc."""
    assert_rejected([work / "good.pb", "-o", "/proc/self/out.pb", "--bn-fold"], capsys, work)
    assert not os.path.exists("/proc/self/out.pb")


def test_output_that_is_a_directory_leaves_no_temp_file(work, capsys):
    """The temp file is created, the rename fails: the temp file must be cleaned up."""
    (work / "out_dir").mkdir()
    assert_rejected([work / "good.pb", "-o", work / "out_dir", "--bn-fold"], capsys, work,
                    "cannot write")
    assert os.listdir(work / "out_dir") == []


def test_report_json_that_cannot_be_written_exits_2_and_writes_no_graph(work, capsys):
    (work / "a_file").write_text("I am a file")
    assert_rejected([work / "good.pb", "-o", work / "out.pb",
                     "--report-json", work / "a_file" / "r.json"], capsys, work)


def test_output_that_cannot_be_written_leaves_no_report_behind(work, capsys):
    (work / "out_dir").mkdir()
    assert_rejected([work / "good.pb", "-o", work / "out_dir", "--report-json", work / "r.json"],
                    capsys, work, "cannot write")


def test_inspect_with_unwritable_report_exits_2(work, capsys):
    assert_rejected(["inspect", work / "good.pb", "--report-json", work / "good.pb" / "r.json"],
                    capsys, work)


# ---------------------------------------------------------------- once crashed with a traceback
def _unknown_op(g):
    add_node(g, "custom", "MyCustomOpNotInThisBinary", ["output"], dtype=tf.float32)


def _const_type_clash(g):
    add_const(g, "c_float", 1.0, tf.float32)
    add_const(g, "c_int", 1, tf.int32)
    add_node(g, "c_sum", "AddV2", ["c_float", "c_int"], dtype=tf.float32)
    add_node(g, "custom", "AddV2", ["output", "c_sum"], dtype=tf.float32)


def test_graph_with_an_op_this_tensorflow_lacks_exits_2(work, article, capsys):
    path = write_graph(work, "custom_op.pb", modified(article.graph_def, _unknown_op))
    assert_rejected([path, "--outputs", "custom"], capsys, work, "MyCustomOpNotInThisBinary")


def test_constant_subgraph_tensorflow_rejects_exits_2(work, article, capsys):
    path = write_graph(work, "type_clash.pb", modified(article.graph_def, _const_type_clash))
    assert_rejected([path, "--outputs", "custom"], capsys, work)


def test_output_port_that_does_not_exist_exits_2(work, capsys):
    assert_rejected([work / "good.pb", "--outputs", "output:3"], capsys, work, "output:3")


@pytest.mark.parametrize("name", ["output", "backend/conv_1/kernel"])
def test_input_that_is_not_a_placeholder_exits_2(name, work, capsys):
    assert_rejected([work / "good.pb", "--inputs", name], capsys, work, name)


@pytest.mark.parametrize("tolerance", ["nan", "-1"])
def test_nonsense_tolerance_exits_2(tolerance, work, capsys):
    assert_rejected([work / "good.pb", "--tolerance", tolerance], capsys, work, "tolerance")


# ---------------------------------------------------------------- malformed but parseable graphs
# Found by fuzzing the whole pipeline (see test_pipeline_fuzz_never_crashes): protobuf parses these,
# and they used to crash a transform with a traceback, hang it, abort TensorFlow, or come out as a
# graph with dangling inputs.
def _conv(g):
    return next(n for n in g.node if n.op == "Conv2D")


def _non_utf8_data_format(g):
    _conv(g).attr["data_format"].s = b"\x82HWC"


def _const_with_invalid_dtype(g):
    gamma = next(n for n in g.node if n.op == "Const" and n.name.endswith("bn_1/gamma"))
    gamma.attr["value"].tensor.dtype = 0          # DT_INVALID


def _const_shape_disagrees_with_content(g):
    kernel = next(n for n in g.node if n.op == "Const" and n.name.endswith("conv_1/kernel"))
    kernel.attr["value"].tensor.tensor_shape.dim[0].size = 0


def test_non_utf8_string_attribute_exits_2(work, article, capsys):
    path = write_graph(work, "utf8.pb", modified(article.graph_def, _non_utf8_data_format))
    assert_rejected([path, "--bn-fold"], capsys, work)


def test_const_with_invalid_dtype_exits_2(work, article, capsys):
    path = write_graph(work, "dtype.pb", modified(article.graph_def, _const_with_invalid_dtype))
    assert_rejected([path, "--bn-fold"], capsys, work)


def test_const_whose_shape_disagrees_with_its_content_exits_2(work, article, capsys):
    path = write_graph(work, "shape.pb",
                       modified(article.graph_def, _const_shape_disagrees_with_content))
    assert_rejected([path, "--bn-fold", "--no-verify", "-o", work / "out.pb"], capsys, work)


def test_placeholder_of_unknown_rank_does_not_abort_the_process(tmp_path):
    """Run in a subprocess: the failure mode kills the interpreter. TF1 graphs built with
    tf.compat.v1.placeholder(tf.float32) and no shape are common."""
    import subprocess
    import sys
    from pathlib import Path
    import numpy as np
    from tfsurgery.models import tf1
    with tf1.v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, name="input")          # no shape at all
        kernel = tf.constant(np.ones([3, 3, 3, 4], np.float32))
        tf.nn.relu(tf.nn.conv2d(x, kernel, 1, "SAME"), name="output")
    (tmp_path / "unknown_rank.pb").write_bytes(graph.as_graph_def().SerializeToString())
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, str(root / "scripts" / "optimize.py"),
                           str(tmp_path / "unknown_rank.pb"), "-q"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode in (0, 2), (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    if done.returncode == 2:
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def _epsilon_of_the_wrong_kind(g):
    bn = next(n for n in g.node if n.name.endswith("bn_1/cond/FusedBatchNorm_1"))
    bn.attr["epsilon"].Clear()
    bn.attr["epsilon"].type = tf.bool.as_datatype_enum        # a type where a float belongs


def _data_format_of_the_wrong_kind(g):
    bias_add = next(n for n in g.node if n.op == "BiasAdd")
    bias_add.attr["data_format"].Clear()
    bias_add.attr["data_format"].type = tf.complex128.as_datatype_enum


def test_float_attribute_holding_a_type_exits_2(work, article, capsys):
    path = write_graph(work, "eps.pb", modified(article.graph_def, _epsilon_of_the_wrong_kind))
    assert_rejected([path, "--bn-fold"], capsys, work)


def test_string_attribute_holding_a_type_exits_2(work, article, capsys):
    path = write_graph(work, "fmt.pb", modified(article.graph_def, _data_format_of_the_wrong_kind))
    assert_rejected([path, "--bn-fold"], capsys, work)


def _output_dead_when_not_training(g):
    ident = next(n for n in g.node if n.name.endswith("dropout_3/cond/Identity"))
    ident.input[0] += ":1"       # the inference branch reads the Switch's *training* port


def test_output_dead_when_not_training_is_refused_even_without_verification(work, article,
                                                                             capsys):
    path = write_graph(work, "dead.pb", modified(article.graph_def, _output_dead_when_not_training))
    assert_rejected([path, "--bn-fold", "--no-verify", "-o", work / "out.pb"], capsys, work)


def _switch_port_out_of_range(g):
    bn = next(n for n in g.node if n.name.endswith("bn_1/cond/FusedBatchNorm_1"))
    bn.input[1] += ":4"                    # a Switch has two outputs


def _identity_port_out_of_range(g):
    switch = next(n for n in g.node if n.name.endswith("bn_1/cond/FusedBatchNorm_1/Switch"))
    switch.input[1] += ":7"                # pred_id is an Identity: one output


def test_input_port_out_of_range_on_a_switch_exits_2(work, article, capsys):
    path = write_graph(work, "port.pb", modified(article.graph_def, _switch_port_out_of_range))
    assert_rejected([path, "--bn-fold"], capsys, work)


def test_input_port_out_of_range_on_an_identity_exits_2(work, article, capsys):
    path = write_graph(work, "port.pb", modified(article.graph_def, _identity_port_out_of_range))
    assert_rejected([path, "--bn-fold", "--no-verify", "-o", work / "out.pb"], capsys, work)


def test_output_on_a_dead_cond_branch_does_not_hang(work, capsys):
    capsys.readouterr()
    with deadline(HANG_SECONDS) as clock:
        code = main([str(work / "good.pb"), "-o", str(work / "out.pb"), "--outputs",
                     "output,backend/bn_1/cond/FusedBatchNorm"])
    assert not clock.expired, f"still running after {HANG_SECONDS} s"
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (0, 2), err
    if code == 2:
        assert len(err) == 1, err


# ---------------------------------------------------------------- fuzzing the loader
def mutations():
    """A short list of byte edits; positions are taken modulo the file length."""
    where = st.integers(0, 2 ** 32 - 1)
    return st.lists(st.one_of(
        st.tuples(st.just("flip"), where, st.integers(0, 7)),
        st.tuples(st.just("set"), where, st.integers(0, 255)),
        st.tuples(st.just("insert"), where, st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("delete"), where, st.integers(1, 16)),
        st.tuples(st.just("truncate"), where, st.just(0)),
    ), min_size=1, max_size=6)


def mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for kind, where, arg in edits:
        pos = where % len(buf) if buf else 0
        if kind == "flip" and buf:
            buf[pos] ^= 1 << arg
        elif kind == "set" and buf:
            buf[pos] = arg
        elif kind == "insert":
            buf[pos:pos] = arg
        elif kind == "delete":
            del buf[pos:pos + arg]
        elif kind == "truncate":
            del buf[pos:]
    return bytes(buf)


@pytest.fixture(scope="module")
def fuzz_seed(tmp_path_factory, article):
    """The article's model as .pb bytes (deterministic: attr maps in a fixed order, so the same
    edits hit the same bytes on every run), and a directory for the mutants."""
    return article.graph_def.SerializeToString(deterministic=True), tmp_path_factory.mktemp("fuzz")


@settings(max_examples=300, database=None, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(edits=mutations(), suffix=st.sampled_from([".pb", ".pb", ".pb", ".pbtxt"]))
def test_loader_fuzz_never_crashes(fuzz_seed, edits, suffix):
    data, directory = fuzz_seed
    if suffix == ".pbtxt":                # the same edits on the text form
        from google.protobuf import text_format
        parsed = graph_pb2.GraphDef()
        parsed.ParseFromString(data)
        data = text_format.MessageToString(parsed).encode()
    path = directory / f"mutant{suffix}"
    path.write_bytes(mutate(data, edits))
    try:
        graph_def = io.load_graph_def(path)
    except io.InputError as error:
        assert str(error) and "\n" not in str(error)
        return
    assert isinstance(graph_def, graph_pb2.GraphDef) and len(graph_def.node) > 0
    Graph(graph_def)                      # a graph the loader accepts can be indexed


# ---------------------------------------------------------------- fuzzing the transforms
# Byte flips mostly give files protobuf rejects. To reach the transforms, mutate the parsed graph
# instead: replace attributes by values of the wrong kind or range, perturb constant tensors, point
# inputs at other output ports. No op types or node names change, so no new constant-only subgraph
# appears and TensorFlow never runs (verification off): a malformed graph can make a TF kernel
# abort the whole process (see the unknown-rank test), which no test process survives.
_ATTR_VALUES = st.one_of(
    st.builds(lambda b: ("s", b), st.binary(max_size=6)),
    st.builds(lambda v: ("i", v), st.integers(-2 ** 40, 2 ** 40)),
    st.builds(lambda v: ("f", v), st.floats(allow_nan=True, allow_infinity=True, width=32)),
    st.builds(lambda v: ("b", v), st.booleans()),
    st.builds(lambda v: ("type", v), st.integers(0, 30)),
    st.builds(lambda v: ("shape", v), st.none() | st.lists(st.integers(-2, 6), max_size=5)),
    st.builds(lambda v: ("ints", v), st.lists(st.integers(-3, 5), max_size=6)),
    st.builds(lambda v: ("tensor_dtype", v), st.integers(0, 30)),
    st.builds(lambda v: ("tensor_shape", v), st.lists(st.integers(-1, 6), max_size=5)),
    st.builds(lambda v: ("tensor_cut", v), st.integers(0, 64)),
    st.just(("delete", None)),
)


def _graph_edits():
    index = st.integers(0, 2 ** 16)
    attr_edit = st.tuples(st.just("attr"), index, index, _ATTR_VALUES)
    port_edit = st.tuples(st.just("port"), index, index, st.integers(0, 7))
    return st.lists(st.one_of(attr_edit, attr_edit, port_edit), min_size=1, max_size=3)


def apply_graph_edit(graph_def, edit):
    kind, which, key_index, value = edit
    node = graph_def.node[which % len(graph_def.node)]
    if kind == "port":
        if node.input:
            k = key_index % len(node.input)
            name = node.input[k].lstrip("^").rsplit(":", 1)[0]
            node.input[k] = name if value == 0 else f"{name}:{value}"
        return
    keys = sorted(node.attr)
    if not keys:
        return
    attr = node.attr[keys[key_index % len(keys)]]
    what, payload = value
    if what == "delete":
        del node.attr[keys[key_index % len(keys)]]
    elif what in ("s", "i", "f", "b", "type"):
        attr.Clear()
        setattr(attr, what, payload)
    elif what == "shape":
        attr.Clear()
        if payload is None:
            attr.shape.unknown_rank = True
        else:
            attr.shape.SetInParent()
            for size in payload:
                attr.shape.dim.add(size=size)
    elif what == "ints":
        attr.Clear()
        attr.list.SetInParent()
        attr.list.i.extend(payload)
    elif attr.HasField("tensor"):
        tensor = attr.tensor
        if what == "tensor_dtype":
            tensor.dtype = payload
        elif what == "tensor_shape":
            del tensor.tensor_shape.dim[:]
            for size in payload:
                tensor.tensor_shape.dim.add(size=size)
        else:
            tensor.tensor_content = tensor.tensor_content[:payload]


@settings(max_examples=300, database=None, derandomize=True, deadline=None,
          phases=[Phase.explicit, Phase.generate],   # no shrinking: a hang would cost 10 s a try
          suppress_health_check=[HealthCheck.too_slow])
@given(edits=_graph_edits())
def _pipeline_fuzz(edits):
    from tfsurgery import api
    graph_def = graph_pb2.GraphDef()
    graph_def.CopyFrom(_FUZZ_GRAPH["article"])
    for edit in edits:
        apply_graph_edit(graph_def, edit)
    result, crash = None, None
    with deadline(HANG_SECONDS) as clock:
        try:
            io.check_graph_def(graph_def, "mutant")
            result = api.optimize(api.Source(graph_def, "mutant"),
                                  api.choose_transforms(bn_fold=True), verify=False)
        except io.InputError as error:
            assert str(error) and "\n" not in str(error)
        except Exception as error:
            crash = f"{type(error).__name__}: {error}"
    assert not clock.expired, f"still running after {HANG_SECONDS} s: an endless loop?"
    assert crash is None, crash
    if result is not None:
        Graph(result.graph_def)           # the result must be a valid graph


def test_pipeline_fuzz_never_crashes(article):
    """Mutated article graphs go through every transform and end in a clean InputError or a
    valid graph (300 examples, about 2 s)."""
    _FUZZ_GRAPH["article"] = article.graph_def
    _pipeline_fuzz()


_FUZZ_GRAPH = {}


def test_a_newline_in_a_node_name_stays_escaped_in_the_one_line_error(tmp_path, capsys):
    """Names come from the untrusted file: a dangling input whose name holds a newline and an
    escape character is reported on one line (escaped), exit 2, nothing written."""
    graph_def = graph_pb2.GraphDef()
    x = graph_def.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = 1
    out = graph_def.node.add(name="out", op="Identity", input=["\nx\x1b[2J"])
    out.attr["T"].type = 1
    path = tmp_path / "newline.pb"
    path.write_bytes(graph_def.SerializeToString())
    with pytest.raises(io.InputError) as refused:
        io.load_model(str(path))
    assert "\n" not in str(refused.value) and "\\nx\\x1b[2J" in str(refused.value)
    assert main([str(path), "-o", str(tmp_path / "out.pb")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "\\nx" in err, err
    assert not (tmp_path / "out.pb").exists()
