"""The incremental structure check finds exactly what a check from scratch finds.

After a clean check, ``Graph.structure_problem`` looks only at what the edits since touched
(tfsurgery/graph/integrity.py): topological positions prove no cycle was closed, and only the
producers edits noted are rechecked. Here random graphs (DAGs, some with while loops whose
NextIteration closes a back edge, some not in topological order, some with colocations) go
through random edit sequences made with the public edit API — rewire, remove, new_node,
add_const, set_input, remove_inputs, edit_node (outputs, op, colocation), prune,
move_control_consumers — some of which break the graph (a dangling input, a cycle, a port the
producer lacks, a colocation with a missing node, a duplicate name, which the index refuses). After each round of edits the verdict of the incremental check
must be, word for word, that of a fresh index's full check and that of this file's own oracle,
written without the index (plain dicts over the GraphDef, a naive fixpoint for cycles).
"""
import random
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2

from conftest import property_examples
from tfsurgery.graph import Graph, GraphError, check_structure

# op → how many data inputs a random node of it gets (IdentityN and Merge: see below)
ARITY = {"Placeholder": 0, "NoOp": 0, "Neg": 1, "Abs": 1, "Identity": 1, "AddV2": 2,
         "Switch": 2, "Split": 2, "IdentityN": None, "Exit": 1}
BACK_EDGES = ("NextIteration", "RefNextIteration")
FLOAT = types_pb2.DT_FLOAT


# ---------------------------------------------------------------- the oracle (no index)
def ports_of(node) -> int:
    """How many outputs a node of the ops used here has (from their OpDefs, written out)."""
    if node.op == "Split":
        return node.attr["num_split"].i
    if node.op == "IdentityN":
        return len(node.attr["T"].list.type)
    return {"NoOp": 0, "Switch": 2, "Merge": 2}.get(node.op, 1)


def split_input(text):
    """(producer, port, control) of an input string, written here without the index's parser."""
    if text.startswith("^"):
        return text[1:], 0, True
    name, _, port = text.partition(":")
    return name, int(port or 0), False


def oracle_problem(graph_def):
    """The first defect, in the order the checker promises: edges (by producer name, then the
    first reader by name), then colocations (by target name), then cycles outside while loops
    (the first node by name that Kahn's order cannot reach)."""
    nodes = {node.name: node for node in graph_def.node}
    assert len(nodes) == len(graph_def.node), "the index let a duplicate name in"
    readers = defaultdict(list)                 # producer → [(reader, index, text, port)]
    for node in graph_def.node:
        for index, text in enumerate(node.input):
            producer, port, control = split_input(text)
            readers[producer].append((node.name, index, text, -1 if control else port))
    for producer in sorted(readers):
        reads = readers[producer]
        if producer not in nodes:
            reader, _, text, _ = min(reads)
            return f"node '{reader}' reads '{text}' but no node '{producer}' exists"
        top, ports = max(port for *_, port in reads), ports_of(nodes[producer])
        if top > 0 and top >= ports:
            return (f"'{producer}:{top}' is read but {nodes[producer].op} '{producer}' has "
                    f"{ports} output(s)")
    missing = defaultdict(list)
    for node in graph_def.node:
        for s in node.attr["_class"].list.s if "_class" in node.attr else ():
            target = s.decode()[len("loc:@"):]
            if target not in nodes:
                missing[target].append(node.name)
    if missing:
        target = min(missing)
        return f"node '{min(missing[target])}' is colocated with missing node '{target}'"
    done, changed = set(), True
    while changed:                              # a node is done when all it waits for are
        changed = False
        for node in graph_def.node:
            waits = {split_input(t)[0] for t in node.input}
            waits = {p for p in waits if p in nodes and nodes[p].op not in BACK_EDGES}
            if node.name not in done and waits <= done:
                done.add(node.name)
                changed = True
    stuck = sorted(set(nodes) - done)
    return f"cycle outside a while loop through node '{stuck[0]}'" if stuck else None


def kind(problem):
    if problem is None:
        return "sound"
    for word, name in (("no node", "dangling"), ("output(s)", "port"), ("colocated", "colocation"),
                       ("cycle", "cycle")):
        if word in problem:
            return name
    raise AssertionError(problem)


# ---------------------------------------------------------------- random graphs
def make_node(name, op, inputs=(), width=None, colocate=None):
    node = node_def_pb2.NodeDef(name=name, op=op, input=list(inputs))
    if op == "Split":
        node.attr["num_split"].i = width or 2
    elif op == "IdentityN":
        node.attr["T"].list.type.extend([FLOAT] * (width or 2))
    elif op not in ("NoOp", "Merge"):
        node.attr["T" if op not in ("Placeholder",) else "dtype"].type = FLOAT
    if colocate:
        node.attr["_class"].CopyFrom(attr_value_pb2.AttrValue(
            list=attr_value_pb2.AttrValue.ListValue(s=[b"loc:@" + colocate.encode()])))
    return node


def tensor_text(name, port):
    return name if port == 0 else f"{name}:{port}"


def random_graph_def(rng):
    """A DAG in topological order, sometimes with while loops (Merge reads the NextIteration
    after it), colocations and control edges; sometimes shuffled out of order."""
    nodes = [make_node("x0", "Placeholder")]

    def tensor():
        producer = rng.choice([n for n in nodes if ports_of(n) > 0])
        return tensor_text(producer.name, rng.randrange(ports_of(producer)))

    for i in range(rng.randint(2, 12)):
        name = f"n{i}"
        if rng.random() < 0.25:                 # a while loop around a Neg
            enter = make_node(f"{name}_enter", "Enter", [tensor()])
            merge = make_node(f"{name}_merge", "Merge", [enter.name, f"{name}_next"])
            body = make_node(f"{name}_body", "Neg", [merge.name])
            nxt = make_node(f"{name}_next", "NextIteration", [body.name])
            nodes += [enter, merge, body, nxt, make_node(name, "Exit", [merge.name])]
            continue
        op = rng.choice(list(ARITY))
        width = rng.randint(1, 3) if op in ("Split", "IdentityN") else None
        count = width if op == "IdentityN" else ARITY[op]
        inputs = [tensor() for _ in range(count)]
        if rng.random() < 0.2:
            inputs.append("^" + rng.choice(nodes).name)
        colocate = rng.choice(nodes).name if rng.random() < 0.1 else None
        nodes.append(make_node(name, op, inputs, width, colocate))
    if rng.random() < 0.2:
        rng.shuffle(nodes)
    graph_def = graph_pb2.GraphDef()
    graph_def.node.extend(nodes)
    return graph_def


# ---------------------------------------------------------------- random edits
def descendants(graph, names):
    """Everything that reads, directly or not, one of ``names`` (control edges included)."""
    seen, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(c.node for c in graph.consumers(name, control=True))
    return seen


def pick_tensor(rng, graph, avoid=(), wild=False):
    """An existing node:port (not in ``avoid``); ``wild``: maybe a missing node or port."""
    if wild and rng.random() < 0.5:
        return rng.choice(["ghost"] + [f"{name}:{rng.randint(1, 4)}" for name in
                                       rng.sample(list(graph.nodes), min(1, len(graph)))])
    choices = [n for n in graph if ports_of(n) > 0 and n.name not in avoid]
    if not choices:
        return None
    producer = rng.choice(choices)
    return tensor_text(producer.name, rng.randrange(ports_of(producer)))


def random_edit(rng, graph, log, removed, wild):
    names = list(graph.nodes)
    with_inputs = [n for n in names if graph.input_refs(n)]
    what = rng.choice(["rewire", "set_input", "remove", "new_node", "edit_node", "colocate"]
                      if wild else
                      ["rewire", "set_input", "remove", "new_node", "new_node", "add_const",
                       "remove_inputs", "edit_node", "colocate", "duplicate", "prune",
                       "move_control"])
    if what == "rewire" and with_inputs:
        reader = rng.choice(with_inputs)
        old = rng.choice(graph.inputs(reader) or [None])
        if old is not None:
            readers = [c.node for c in graph.consumers(old.node, old.port)]
            new = pick_tensor(rng, graph, avoid=() if wild else descendants(graph, readers),
                              wild=wild)
            if new is not None:
                log.append(f"rewire({str(old)!r}, {new!r})")
                graph.rewire(old, new)
    elif what == "set_input" and with_inputs:
        name = rng.choice(with_inputs)
        index = rng.randrange(len(graph.input_refs(name)))
        control = graph.input_refs(name)[index].control
        avoid = () if wild else descendants(graph, [name])
        if control:
            choices = [n for n in names if n not in avoid]
            new = "^" + (rng.choice(choices) if choices and not (wild and rng.random() < 0.3)
                         else "ghost")
        else:
            new = pick_tensor(rng, graph, avoid=avoid, wild=wild)
        if new is not None:
            log.append(f"set_input({name!r}, {index}, {new!r})")
            graph.set_input(name, index, new)
    elif what == "remove" and names:
        if wild:
            gone = rng.sample(names, min(len(names), rng.randint(1, 2)))
        else:                                   # only nodes nothing reads
            gone = [n for n in names if not graph.reader_count(n)][:1]
        log.append(f"remove({gone!r})")
        graph.remove(gone)
        removed.extend(gone)
    elif what == "new_node":
        op = rng.choice(["Neg", "AddV2", "Switch", "IdentityN", "NextIteration"])
        name = rng.choice(removed) if removed and rng.random() < 0.5 else f"new{len(log)}"
        if name in graph:
            name = f"new{len(log)}"
        # a name re-added: its old readers read it again; safe inputs do not depend on them
        avoid = descendants(graph, [c.node for c in graph.consumers(name, control=True)])
        count = 2 if op in ("AddV2", "Switch", "IdentityN") else 1
        inputs = [pick_tensor(rng, graph, avoid=() if wild else avoid, wild=wild)
                  for _ in range(count)]
        if wild and rng.random() < 0.2:
            inputs[0] = name                    # reads itself
        if None not in inputs:
            attrs = {"T": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                type=[FLOAT] * count))} if op == "IdentityN" else None
            log.append(f"new_node({op!r}, {name!r}, {inputs!r})")
            graph.new_node(op, name, inputs, attrs)
    elif what == "add_const":
        log.append("add_const('c')")
        graph.add_const("c", rng.random())
    elif what == "remove_inputs" and with_inputs:
        name = rng.choice(with_inputs)
        count = len(graph.input_refs(name))
        drop = rng.sample(range(count), rng.randint(1, count))
        log.append(f"remove_inputs({name!r}, {drop!r})")
        graph.remove_inputs(name, drop)
    elif what == "edit_node":
        widths = [n for n in names if graph.op(n) in ("Split", "IdentityN")]
        if names and rng.random() < 0.3:        # a colocation set, moved or dropped
            name = rng.choice(names)
            target = "ghost" if wild and rng.random() < 0.5 else rng.choice(names + [None])
            log.append(f"edit_node({name!r})._class = {target!r}")
            node = graph.edit_node(name)
            if target is None:
                if "_class" in node.attr:
                    del node.attr["_class"]
            else:
                node.attr["_class"].list.s[:] = [b"loc:@" + target.encode()]
        elif widths and rng.random() < 0.7:     # fewer or more outputs
            name = rng.choice(widths)
            ports = ports_of(graph.node(name))
            width = rng.randint(1, ports) if wild else ports + 1
            log.append(f"edit_node({name!r}) width {width}")
            node = graph.edit_node(name)
            if node.op == "Split":
                node.attr["num_split"].i = width
            else:
                del node.attr["T"].list.type[:]
                node.attr["T"].list.type.extend([FLOAT] * width)
        else:                                   # another op (a back edge appears or goes)
            ones = [n for n in names if graph.op(n) in ("Neg", "Abs", "NextIteration")]
            if ones:
                name = rng.choice(ones)
                op = rng.choice(["Abs", "NextIteration"] if wild else ["Abs", "Neg"])
                if graph.op(name) == "NextIteration" and not wild:
                    op = "NextIteration"
                log.append(f"edit_node({name!r}).op = {op!r}")
                graph.edit_node(name).op = op
    elif what == "colocate" and names:
        target = "ghost" if wild and rng.random() < 0.5 else rng.choice(names)
        source = pick_tensor(rng, graph)
        if source is not None:
            where = attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                s=[b"loc:@" + target.encode()]))
            log.append(f"new_node('Neg', 'placed', [{source!r}], _class={target!r})")
            graph.new_node("Neg", "placed", [source], {"_class": where, "T": FLOAT_TYPE})
    elif what == "duplicate" and names:         # refused, and nothing changes
        name = rng.choice(names)
        before = graph.to_graph_def().SerializeToString(deterministic=True)
        log.append(f"add_node({name!r}) refused")
        with pytest.raises(GraphError, match="already exists"):
            graph.add_node(make_node(name, "Placeholder"))
        assert graph.to_graph_def().SerializeToString(deterministic=True) == before
    elif what == "prune" and names:
        keep = rng.sample(names, min(len(names), 2))
        log.append(f"prune({keep!r})")
        removed.extend(graph.prune(keep))
    elif what == "move_control" and names:
        old = rng.choice(names)
        log.append(f"move_control_consumers({old!r}, None)")
        graph.move_control_consumers(old, None)


FLOAT_TYPE = attr_value_pb2.AttrValue(type=FLOAT)


def run_sequence(rng):
    """Rounds of random edits, each followed by the three checks; returns the verdicts' kinds."""
    graph_def = random_graph_def(rng)
    graph = Graph(graph_def)
    log, removed, kinds = [f"graph of {len(graph_def.node)} nodes"], [], []
    if rng.random() < 0.5:
        check(graph, log)                       # a clean check first: the next is incremental
    for _ in range(rng.randint(1, 4)):
        wild = rng.random() < 0.3
        for _ in range(rng.randint(1, 8)):
            random_edit(rng, graph, log, removed, wild and rng.random() < 0.4)
        kinds.append(kind(check(graph, log)))
    return kinds


def check(graph, log):
    incremental = graph.structure_problem()
    graph_def = graph.to_graph_def()
    scratch = Graph(graph_def, check_inputs=False).structure_problem()
    expected = oracle_problem(graph_def)
    trail = "\n".join(log)
    assert incremental == scratch == expected, f"{trail}\nincremental: {incremental}\n" \
        f"from scratch: {scratch}\noracle: {expected}"
    assert graph.structure_problem() == incremental          # asked again: the same answer
    edge_defect = kind(expected) in ("dangling", "port")
    try:                                        # the loader's check agrees on edges
        check_structure(graph_def)
        assert not edge_defect, trail
    except GraphError:
        assert edge_defect, trail
    log.append(f"-> {incremental}")
    return incremental


@settings(max_examples=property_examples(default=150, long=3000), deadline=None,
          database=None, derandomize=True, print_blob=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.randoms(use_true_random=False))
def test_incremental_check_finds_what_a_full_check_finds(rng):
    run_sequence(rng)


def test_the_random_edits_reach_every_verdict():
    """The generator is not toothless: over fixed seeds, every kind of defect appears, and sound
    graphs too (most of them after edits, so through the incremental check)."""
    seen = defaultdict(int)
    for seed in range(120):
        for verdict in run_sequence(random.Random(seed)):
            seen[verdict] += 1
    assert set(seen) == {"sound", "dangling", "port", "cycle", "colocation"}, dict(seen)
    assert min(seen.values()) >= 3, dict(seen)


def test_a_defect_in_a_loop_graph_is_named_the_same_way():
    """A while loop stays legal through edits; turning its NextIteration into a plain op closes
    a cycle outside a loop, which both checks name by the same (first) node."""
    graph = Graph(random_graph_def(random.Random(0)))
    graph.new_node("Neg", "seed", ["x0"])
    enter = graph.new_node("Enter", "enter", ["seed"]).name
    merge = graph.new_node("Merge", "merge", [enter, enter]).name
    body = graph.new_node("Neg", "body", [merge]).name
    nxt = graph.new_node("NextIteration", "next", [body]).name
    graph.set_input(merge, 1, nxt)
    assert graph.structure_problem() is None
    graph.edit_node(nxt).op = "Neg"
    found = graph.structure_problem()
    assert found == Graph(graph.to_graph_def(), check_inputs=False).structure_problem() == \
        "cycle outside a while loop through node 'body'"
