"""The graph index: refs, consumers, edits, pruning, topological order with cycles."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

from tfsurgery.graph import Graph, GraphError, Ref, format_ref, parse_ref


def node(name, op, *inputs):
    return node_def_pb2.NodeDef(name=name, op=op, input=list(inputs))


def graph_def(*nodes):
    gd = graph_pb2.GraphDef()
    gd.node.extend(nodes)
    return gd


def const(name, value):
    n = node(name, "Const")
    n.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    n.attr["dtype"].type = n.attr["value"].tensor.dtype
    return n


@pytest.mark.parametrize("text, ref", [("a", Ref("a", 0, False)), ("a:3", Ref("a", 3, False)),
                                       ("^a", Ref("a", 0, True)), ("sc/op:12", Ref("sc/op", 12)),
                                       ("x:y", Ref("x:y", 0, False))])
def test_parse_and_format_refs(text, ref):
    assert parse_ref(text) == ref
    if text != "x:y":
        assert format_ref(*ref) == text


def test_consumers_by_port_and_control():
    g = Graph(graph_def(node("s", "Switch"), node("a", "Neg", "s:1"), node("b", "Neg", "s"),
                        node("c", "NoOp", "^s")))
    assert {c.node for c in g.consumers("s", 1)} == {"a"}
    assert {c.node for c in g.consumers("s", 0)} == {"b"}
    assert {c.node for c in g.consumers("s")} == {"a", "b"}
    assert {c.node for c in g.consumers("s", control=True)} == {"a", "b", "c"}
    assert g.has_control_consumers("s")


def test_rewire_remove_and_prune_keep_index_consistent():
    g = Graph(graph_def(node("x", "Placeholder"), node("i", "Identity", "x"),
                        node("y", "Neg", "i"), node("z", "Abs", "i", "^y"),
                        node("dead", "Neg", "x")))
    assert g.rewire("i", "x") == 2
    g.remove(["i"])
    assert g.inputs("y") == [Ref("x")]
    assert {c.node for c in g.consumers("x")} == {"y", "z", "dead"}
    removed = g.prune(["z"])
    assert sorted(removed) == ["dead"]
    assert set(g.nodes) == {"x", "y", "z"}    # y survives: z has a control edge on it
    out = g.to_graph_def()
    assert [n.name for n in out.node] == ["x", "y", "z"]


def test_duplicate_names_and_dangling_inputs_are_errors():
    with pytest.raises(GraphError, match="duplicate"):
        Graph(graph_def(node("a", "NoOp"), node("a", "NoOp")))
    with pytest.raises(GraphError, match="missing|no node"):
        Graph(graph_def(node("a", "Neg", "ghost")))
    with pytest.raises(GraphError, match="control input"):
        Graph(graph_def(node("a", "NoOp", "^ghost")))


def test_constants_round_trip_through_tensorflow():
    g = Graph(graph_def(const("c", np.arange(6, dtype=np.float32).reshape(2, 3)),
                        node("r", "Identity", "c")))
    np.testing.assert_array_equal(g.const_value("r"), np.arange(6).reshape(2, 3))
    assert g.const_value("r", through_identity=False) is None
    name = g.add_const("c", np.float64(2.5))
    assert name == "c_1" and g.const_value(name) == 2.5
    g.set_const_value("c", np.ones(2, np.int64))
    assert g.const_value("c").dtype == np.int64


def test_topological_order_tolerates_while_loop_cycles():
    g = Graph(graph_def(node("x", "Placeholder"), node("enter", "Enter", "x"),
                        node("merge", "Merge", "enter", "next"), node("body", "Neg", "merge"),
                        node("next", "NextIteration", "body"), node("exit", "Exit", "merge")))
    order = g.topological_order()
    assert sorted(order) == sorted(g.nodes)
    assert order.index("x") < order.index("enter")
    assert g.ancestors(["exit"]) == set(g.nodes)


def test_the_callers_graph_def_is_never_touched():
    original = graph_def(node("x", "Placeholder"), node("y", "Neg", "x"))
    before = original.SerializeToString()
    g = Graph(original)
    g.new_node("Abs", "z", ["y"])
    g.rewire("x", "z")
    g.remove(["y"])
    assert original.SerializeToString() == before


def test_index_scales_linearly_to_large_graphs():
    # 100k nodes in a chain: building, rewiring every edge and ordering must not be quadratic;
    # no timing assertion, but a quadratic index would take hours here.
    nodes = [node("n0", "Placeholder")] + [node(f"n{i}", "Neg", f"n{i - 1}")
                                          for i in range(1, 100_000)]
    g = Graph(graph_def(*nodes))
    assert len(g.topological_order()) == 100_000
    assert len(g.ancestors(["n99999"])) == 100_000    # no recursion-depth error


def test_function_library_api():
    """Graph reads, finds the called functions of (transitively, gradients too) and drops
    library functions; the GraphDef it writes carries the library that is left."""
    from tensorflow.core.framework import function_pb2, graph_pb2
    library = function_pb2.FunctionDefLibrary()
    for name in ("outer", "inner", "inner_grad", "orphan"):
        library.function.add().signature.name = name
    library.function[0].node_def.add(name="call", op="PartitionedCall").attr["f"].func.name = "inner"
    library.gradient.add(function_name="inner", gradient_func="inner_grad")
    graph_def = graph_pb2.GraphDef(library=library)
    graph_def.node.add(name="c", op="StatefulPartitionedCall").attr["f"].func.name = "outer"
    graph = Graph(graph_def, check_inputs=False)
    assert graph.function("inner").signature.name == "inner" and graph.function("nope") is None
    assert graph.called_functions() == {"outer", "inner", "inner_grad"}
    graph.remove_functions(graph.function_names() - graph.called_functions())
    assert graph.function_names() == {"outer", "inner", "inner_grad"}
    graph.remove_functions(["inner"])
    assert not graph.to_graph_def().library.gradient


@pytest.mark.parametrize("value", [
    np.arange(24, dtype=np.float32).reshape(2, 3, 4), np.float32(2.5), np.array([7], np.int32),
    np.array([[1, 2]], np.int64), np.arange(6, dtype=np.float16), np.array([1.5, -2.0]),
    np.array([True, False]), np.array([b"a", b"bc"]), np.zeros((0, 3), np.float32),
    np.arange(12, dtype=np.uint8).reshape(3, 4)[:, ::2]])
def test_const_values_are_written_and_read_as_tensorflow_does(value):
    """encode/decode take shortcuts for packed arrays; the protos and arrays are TF's own."""
    from tfsurgery.graph import decode_tensor, encode_tensor
    proto = encode_tensor(value)
    assert proto.SerializeToString(deterministic=True) == \
        tf.make_tensor_proto(value).SerializeToString(deterministic=True)
    decoded, expected = decode_tensor(proto), tf.make_ndarray(tf.make_tensor_proto(value))
    assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
    np.testing.assert_array_equal(decoded, expected)
    assert not decoded.flags.writeable          # shared values: callers make new arrays


def test_packed_dtypes_are_the_ones_tensorflow_packs():
    """Our list of the dtypes make_tensor_proto writes as raw bytes is TensorFlow's own (its
    private ``_TENSOR_CONTENT_TYPES``, read here only to catch a TF upgrade that changes it)."""
    from tensorflow.python.framework import tensor_util
    from tfsurgery.graph import PACKED_DTYPES
    theirs = getattr(tensor_util, "_TENSOR_CONTENT_TYPES", None)
    if theirs is None:
        pytest.skip("this TensorFlow has no _TENSOR_CONTENT_TYPES to compare with")
    assert PACKED_DTYPES == {dtype.as_datatype_enum for dtype in theirs}


def test_mutable_is_a_deprecated_name_of_edit_node():
    g = Graph(graph_def(node("x", "Placeholder"), node("y", "Neg", "x")))
    with pytest.warns(DeprecationWarning, match="edit_node"):
        g.mutable("y").op = "Abs"
    assert [n.name for n in g.nodes_with_ops({"Abs"})] == ["y"]
    assert g.structure_problem() is None


def test_const_values_are_cached_and_forgotten_on_change():
    g = Graph(graph_def(const("c", np.arange(3, dtype=np.float32)), node("r", "Identity", "c")))
    first = g.const_value("c")
    assert g.const_value("r") is first                       # decoded once
    g.set_const_value("c", np.ones(3, np.float32))
    np.testing.assert_array_equal(g.const_value("c"), np.ones(3))
    g.remove(["r", "c"])
    g.add_const("c", np.float32(4.0))
    assert g.const_value("c") == 4.0


def _by_iteration(g, ops, named=()):
    return [n.name for n in g if n.op in ops or n.name in named]


def test_nodes_with_ops_is_iteration_filtered_by_op_through_edits():
    """The op index answers what filtering the graph's iteration would, in graph order: after
    adds, removals, a name re-added with another op, and an op changed through ``edit_node``."""
    g = Graph(graph_def(node("x", "Placeholder"), node("a", "Neg", "x"), node("b", "Abs", "a"),
                        node("c", "Neg", "b"), node("flag", "Placeholder"), node("d", "Abs", "c")))
    g.new_node("Neg", "e", ["d"])
    g.remove(["b"])
    g.new_node("Neg", "b", ["a"])              # the same name, now last and a Neg
    g.set_input("c", 0, "b")
    g.edit_node("a").op = "Abs"                  # changed in place: keeps its place in order
    g.edit_node("flag").op = "Neg"
    for ops, named in [({"Neg"}, ()), ({"Abs"}, ()), ({"Neg", "Abs"}, ()), ({"Relu"}, ()),
                       ({"Abs"}, {"x", "e", "missing"}), ({"Placeholder", "Neg"}, ())]:
        assert [n.name for n in g.nodes_with_ops(ops, named=named)] == \
            _by_iteration(g, ops, named), (ops, named)
    assert [n.name for n in g.nodes_with_ops({"Neg"})] == ["c", "flag", "e", "b"]


def test_prune_without_a_walk_when_every_node_has_a_reader():
    """Every non-output node read by someone (no loops): nothing is dead. A dead node, or a
    dead while loop (its nodes read each other), is still found by the walk."""
    alive = Graph(graph_def(node("x", "Placeholder"), node("a", "Neg", "x"),
                            node("c", "NoOp", "^a"), node("y", "Abs", "a", "^c")))
    assert alive.prune(["y"], keep=["x"]) == [] and len(alive) == 4
    chain = Graph(graph_def(node("x", "Placeholder"), node("a", "Neg", "x"),
                            node("dead", "Neg", "a"), node("y", "Abs", "a")))
    assert chain.prune(["y"]) == ["dead"]
    loop = Graph(graph_def(node("x", "Placeholder"), node("y", "Neg", "x"),
                           node("enter", "Enter", "x"), node("merge", "Merge", "enter", "next"),
                           node("body", "Neg", "merge"), node("next", "NextIteration", "body")))
    assert sorted(loop.prune(["y"])) == ["body", "enter", "merge", "next"]


def _fresh_prune(g, roots):
    """What a new index of the same graph prunes (no proof carried over): the oracle."""
    return sorted(Graph(g.to_graph_def()).prune(roots))


@pytest.mark.parametrize("edit", ["set_input", "remove_reader", "new_node", "remove_inputs",
                                  "other_roots"])
def test_prune_after_edits_finds_the_nodes_they_left_unread(edit):
    """After a proof that every node is needed, prune looks again only at the nodes edits
    added or took readers from — and still finds every node they left dead."""
    g = Graph(graph_def(node("x", "Placeholder"), node("a", "Neg", "x"), node("b", "Abs", "a"),
                        node("c", "NoOp", "^b"), node("y", "Neg", "b", "^c"),
                        node("z", "Abs", "y")))
    assert g.prune(["z"], keep=["x"]) == []           # the proof is made here
    roots = ["z"]
    if edit == "set_input":
        g.set_input("z", 0, "x")                      # y, and all it needed, unread
    elif edit == "remove_reader":
        g.rewire("y", "b")
        g.remove(["y"])
    elif edit == "new_node":
        g.new_node("Neg", "dangling", ["a"])
    elif edit == "remove_inputs":
        g.remove_inputs("y", [1])                     # ^c: c is read by no one
    else:
        roots = ["y"]                                 # z is not needed any more
    expected = _fresh_prune(g, roots + ["x"])
    assert expected, "the edit should leave something dead"
    assert sorted(g.prune(roots, keep=["x"])) == expected
    assert g.prune(roots, keep=["x"]) == []
    assert g.structure_problem() is None


def _chain_graph():
    return Graph(graph_def(node("x", "Placeholder"), node("s", "Switch", "x", "x"),
                           node("a", "Neg", "s:1"), node("b", "Neg", "a"), node("c", "Abs", "b")))


def _colocated_with_missing(g):
    where = attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=[b"loc:@gone"]))
    g.new_node("Neg", "n", ["c"], {"_class": where})


@pytest.mark.parametrize("breakage, message", [
    (lambda g: (g.remove(["b"]), g.new_node("Neg", "b", ["c"])), "cycle outside a while loop"),
    (lambda g: g.new_node("Neg", "n", ["gone"]), "no node 'gone'"),
    (lambda g: g.remove(["b"]), "no node 'b'"),
    (lambda g: (g.remove(["s"]), g.new_node("Neg", "s", ["x"])), "has 1 output"),
    (lambda g: g.new_node("Neg", "n", ["s:2"]), "has 2 output"),
    (lambda g: g.set_input("b", 0, "c"), "cycle outside a while loop"),
    (lambda g: g.set_input("c", 0, "s:5"), "has 2 output"),
    (_colocated_with_missing, "colocated with missing node 'gone'"),
])
def test_checks_after_edits_find_what_a_full_check_finds(breakage, message):
    """After a clean check, the next one looks only at the edges edits touched (and proves no
    cycle by topological positions); it reports what walking the whole graph reports."""
    g = _chain_graph()
    assert g.structure_problem() is None
    breakage(g)
    found = g.structure_problem()
    assert found is not None and message in found
    assert found == Graph(g.to_graph_def(), check_inputs=False).structure_problem()


def _count_full_walks(monkeypatch):
    """A list that grows by one each time the structure check walks the whole graph."""
    from tfsurgery.graph import integrity
    walks, kahn = [], integrity.kahn
    monkeypatch.setattr(integrity, "kahn", lambda *a, **kw: walks.append(1) or kahn(*a, **kw))
    return walks


def test_sound_edits_are_checked_without_walking_the_graph(monkeypatch):
    """Edits through the index (a node replaced under its name, a new constant, a rewired
    input) keep the topological proof; a node handed out by ``edit_node`` brings a full check."""
    g = _chain_graph()
    walks = _count_full_walks(monkeypatch)
    g.remove(["b"])
    bias = g.add_const("bias", np.ones(3, np.float32))
    g.new_node("BiasAdd", "b", ["a", bias])
    g.set_input("c", 0, "a")
    g.set_input("c", 0, "b")
    g.remove(["x"]), g.new_node("Placeholder", "x")
    assert g.structure_problem() is None and walks == []
    g.edit_node("c")
    assert g.structure_problem() is None and walks == [1]
    g.remove_inputs("c", [0])
    assert g.structure_problem() is None and walks == [1]


def test_a_graph_not_in_topological_order_is_checked_in_full_once(monkeypatch):
    g = Graph(graph_def(node("b", "Neg", "a"), node("a", "Placeholder")))
    walks = _count_full_walks(monkeypatch)
    assert g.structure_problem() is None and walks == [1]
    g.new_node("Neg", "c", ["b"])
    assert g.structure_problem() is None and walks == [1]


def test_static_shapes_import_the_asked_nodes_ancestors_first(monkeypatch):
    """The first question imports only the ancestors of the node asked about when they are few;
    a question they do not answer imports everything live; the shapes are the same."""
    from tfsurgery import tfsession
    with tf.Graph().as_default() as tf_graph:
        x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 3], name="x")
        y = tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]], name="pad")
        for i in range(12):
            y = tf.nn.relu(y, name=f"relu_{i}")
        tf.reshape(y, [1, -1], name="out")
    imported = []
    real = tfsession.static_shapes
    monkeypatch.setattr(tfsession, "static_shapes",
                        lambda gd: imported.append(len(gd.node)) or real(gd))
    graph = Graph(tf_graph.as_graph_def())
    shapes = tfsession.StaticShapes(graph, ["out"])
    assert shapes.get("x") == [1, 8, 8, 3] and shapes.get("pad") == [1, 10, 10, 3]
    assert shapes.get("out") == [1, 300] and "relu_11" in shapes
    full = real(graph.to_graph_def())
    assert shapes.get("relu_5") == full["relu_5"] == [1, 10, 10, 3]
    assert imported == [1, len(graph)]         # x alone, then every live node, once


def test_every_graph_method_the_reference_page_names_exists():
    """docs/graph_api.md is the public API a plugin is written against: each ``graph.name``
    it names is a Graph method, and the names issue 21 promised are among them."""
    import re
    from pathlib import Path
    page = (Path(__file__).resolve().parent.parent / "docs" / "graph_api.md").read_text()
    named = set(re.findall(r"`graph\.(\w+)\(", page))
    assert {"node", "nodes_with_ops", "consumers", "const_value", "set_const_value", "add_const",
            "new_node", "rewire", "remove", "edit_node", "mutable"} <= named
    assert [name for name in sorted(named) if not callable(getattr(Graph, name, None))] == []


def test_op_reads_the_op_index_and_follows_what_edit_node_changes():
    """``Graph.op`` answers from the index without touching NodeDefs; a node ``edit_node``
    handed out is read itself, however late its op is changed (even after a query refiled it)."""
    g = Graph(graph_def(node("x", "Placeholder"), node("a", "Neg", "x"), node("b", "Abs", "a")))
    assert [g.op(r) for r in ("a", "a:1", "^a", Ref("a", 2), "missing", Ref("missing"), None)] \
        == ["Neg", "Neg", "Neg", "Neg", None, None, None]
    handed = g.edit_node("a")
    handed.op = "Abs"
    assert g.op("a") == "Abs" and [n.name for n in g.nodes_with_ops({"Abs"})] == ["a", "b"]
    handed.op = "Relu"                         # after the query refiled it
    assert g.op("a") == g.op(Ref("a")) == "Relu"
    g.remove(["b"])
    assert g.op("b") is None
    g.new_node("Exp", "b", ["a"])
    assert g.op("b:0") == "Exp" and g.is_const("b") is False


def test_const_values_alike_stack_packed_constants_as_tensorflow_reads_them():
    """One buffer for several packed Consts of one dtype and shape (through identities); None
    when any is not such a Const, so the caller reads them one by one."""
    rng = np.random.default_rng(7)
    values = [rng.standard_normal(5).astype(np.float32) for _ in range(3)]
    g = Graph(graph_def(const("a", values[0]), const("b", values[1]), const("c", values[2]),
                        node("b_read", "Identity", "b"),
                        const("wide", rng.standard_normal(6).astype(np.float32)),
                        const("half", values[0].astype(np.float16)),
                        const("scalar", np.float32(2.0)), const("filled", np.ones(5, np.float32)),
                        node("x", "Placeholder")))
    refs = [Ref("a"), Ref("b_read"), Ref("c")]
    stacked = g.const_values_alike(refs)
    expected = np.stack([tf.make_ndarray(g.node(n).attr["value"].tensor) for n in "abc"])
    np.testing.assert_array_equal(stacked, expected)
    assert stacked.dtype == np.float32 and not stacked.flags.writeable
    for other in ("wide", "half", "scalar", "x", "missing"):
        assert g.const_values_alike([Ref("a"), Ref(other)]) is None, other
    assert g.const_values_alike([Ref("a", 1), Ref("c")]) is None
    # make_tensor_proto writes np.ones(5) packed; a broadcast fill (one float_val) is not
    filled = g.edit_node("filled").attr["value"].tensor
    filled.ClearField("tensor_content")
    filled.float_val.append(1.0)
    assert g.const_values_alike([Ref("a"), Ref("filled")]) is None
    np.testing.assert_array_equal(g.const_value("filled"), np.ones(5, np.float32))
