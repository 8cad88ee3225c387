"""simplify-algebra: algebraic identities that make an op (or a pair of ops) unnecessary.

Each rule states its exactness. *Exact*: the result is bit-identical in IEEE arithmetic for every
input (NaN, Inf and signed zeros included). *Not bit-exact*: equal in real arithmetic, different
in the last bits (or in the sign of a zero) for some inputs; these run unless ``exact`` is set
(``--exact``), and the report counts them apart ("reassociated").

- ``x + (-y)`` → ``x - y``, ``(-x) + y`` → ``y - x``, ``x - (-y)`` → ``x + y``: exact (IEEE
  defines subtraction as the addition of the negation).
- ``LogicalNot(a < b)`` → ``a >= b`` (and ``<=``, ``>``, ``>=``, ``==``, ``!=``): exact for integer and
  bool operands only. For floats ``!(a < b)`` is true when either is NaN and ``a >= b`` is not:
  refused (Grappler's RemoveLogicalNotStage rewrites floats too). ``==``/``!=`` are each other's
  negation for NaN too, so they are rewritten for every dtype.
- Involutions: ``LogicalNot(LogicalNot(x))``, ``Conj(Conj(x))``, ``Neg(Neg(x))`` → ``x``: exact.
  ``Reciprocal(Reciprocal(x))`` → ``x``: not bit-exact (``1/(1/x)`` rounds twice; subnormal ``x``
  becomes Inf) — only without ``exact``. Also around a chain of value-preserving ops
  (``Identity``, ``Snapshot``, ``Reshape``, ``Squeeze``, ``ExpandDims``, ``Transpose``: they move
  elements, an element-wise op commutes with them): ``f(chain(f(x)))`` → ``chain(x)``, each link
  read by the next alone.
- ``c * (p + p)`` → ``p * (2c)`` (``Add(p, p)`` as ``p * 2``, its constant then pushed down): only
  where the sum's one reader multiplies it by a constant — alone, ``p * 2`` would cost a constant
  node more than ``p + p``. Not bit-exact (``p + p`` may overflow where ``p * 2c`` does not).
- ``x*y1 + y2*x`` → ``x * (y1 + y2)`` and ``y1/x + y2/x`` → ``(y1 + y2)/x`` (floats only: an integer
  ``Div`` truncates): reassociating, not bit-exact — only without ``exact``; both products
  (quotients) read by the sum alone.
- Constant push-down: ``c1 + (x + c2)`` → ``x + (c1 + c2)`` and ``c1 * (x * c2)`` → ``x * (c1 * c2)``,
  in any operand order, the inner op read by the outer alone; the constants are combined here.
  Exact for integers (two's complement wraps the same); reassociating for floats — only without
  ``exact``.
- A tree of ``Add``/``AddV2``/``AddN`` over tensors of one fully known static shape (no
  broadcasting anywhere) → one ``AddN`` of its leaves, in order: the inner sums read by the tree
  alone. Not guaranteed bit-exact (AddN sums in the kernel's order) — only without ``exact``, and
  only with ``sum_trees`` (on by default). TFLite's ``ADD_N`` has no int8 kernel: the TFLite
  int8 export turns every ``AddN`` back into ``AddV2``s first (``adds_of_add_n``).
- ``Split``/``SplitV`` into one piece → the input: exact. (A ``Concat``/``ConcatV2`` of one input
  cannot occur: their OpDefs require ``N >= 2`` and TensorFlow refuses such a graph.)
- ``MatMul(Transpose(a, [1, 0]), b)`` → ``MatMul(a, b, transpose_a=¬transpose_a)`` (and ``b``);
  ``BatchMatMul*`` with a Transpose swapping the last two axes → ``adj_x``/``adj_y`` for real
  dtypes (for complex ``adj`` conjugates too: refused): exact, the same products and sums.
- ``x * OnesLike(x)`` → ``x``: exact. ``x + ZerosLike(x)`` → ``x``: exact for integers; for floats
  ``-0 + 0`` is ``+0``, so only without ``exact``. The OnesLike/ZerosLike must be of ``x`` itself,
  or of a tensor whose static shape and dtype equal ``x``'s (no broadcasting); else refused.

Graph outputs keep their names (a bypassed output becomes an Identity). Runs to its own fixpoint.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from tensorflow.core.framework import attr_value_pb2, types_pb2

from tfsurgery.graph import Graph, Ref
from tfsurgery.tfsession import StaticShapes
from tfsurgery.contract import Options, TransformReport, transform

ADDS = ("Add", "AddV2")
NEGATED = {"Less": "GreaterEqual", "LessEqual": "Greater", "Greater": "LessEqual",
           "GreaterEqual": "Less", "Equal": "NotEqual", "NotEqual": "Equal"}
NAN_SAFE = ("Equal", "NotEqual")            # ¬(a == b) is a != b for NaN too
INVOLUTIONS = {"LogicalNot": True, "Conj": True, "Neg": True, "Reciprocal": False}  # op → exact
VALUE_PRESERVING = ("Identity", "Snapshot", "Reshape", "Squeeze", "ExpandDims", "Transpose")
QUOTIENTS = ("RealDiv", "Div")
ONE_PIECE = ("Split", "SplitV")
MATMULS = {"MatMul": ("transpose_a", "transpose_b"), "BatchMatMul": ("adj_x", "adj_y"),
           "BatchMatMulV2": ("adj_x", "adj_y"), "BatchMatMulV3": ("adj_x", "adj_y")}
FLOATS = {types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE}
COMPLEX = {types_pb2.DT_COMPLEX64, types_pb2.DT_COMPLEX128}
INTEGERS = {types_pb2.DT_INT8, types_pb2.DT_INT16, types_pb2.DT_INT32, types_pb2.DT_INT64,
            types_pb2.DT_UINT8, types_pb2.DT_UINT16, types_pb2.DT_UINT32, types_pb2.DT_UINT64}
RULE_OPS = frozenset(ADDS) | {"Sub", "Mul", "LogicalNot", "SelectV2"} | \
    frozenset(INVOLUTIONS) | frozenset(ONE_PIECE) | frozenset(MATMULS)
MAX_ROUNDS = 10


@dataclasses.dataclass
class SimplifyAlgebraParams:
    exact: bool = False     # only rewrites that are bit-exact in IEEE arithmetic (--exact)
    sum_trees: bool = True  # a tree of sums of one shape as one AddN


@transform("simplify-algebra", repeat=True, params=SimplifyAlgebraParams)
def simplify_algebra(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("simplify-algebra")
    params = options.params_for(simplify_algebra)
    rules = _Rules(graph, options, report, params.exact)
    rules.sum_trees = params.sum_trees
    for _ in range(MAX_ROUNDS):
        rules.shapes = StaticShapes(graph, options.outputs)
        changed = sum(rules.apply(name) for name in graph.names_with_ops(RULE_OPS)
                      if name in graph)
        if not changed:
            break
    if rules.reassociated:
        report.notes.append(f"reassociated: {rules.reassociated} rewrite(s) not bit-exact in "
                            "IEEE arithmetic (--exact turns them off)")
    return report


class _Rules:
    def __init__(self, graph: Graph, options: Options, report: TransformReport, exact: bool):
        self.graph, self.options, self.report, self.exact = graph, options, report, exact
        self.shapes = None
        self.reassociated = 0
        self.sum_trees = True

    def apply(self, name: str) -> bool:
        graph = self.graph
        op = graph.op(name)
        if graph.control_inputs(name):
            return False
        if op in ADDS:
            return self._add_of_negation(name) or self._double(name) or \
                self._plus_zeros_like(name) or self._common_factor(name) or \
                self._push_down_constant(name) or self._sum_tree(name)
        if op == "Sub":
            return self._minus_negation(name)
        if op == "Mul":
            return self._times_ones_like(name) or self._push_down_constant(name)
        if op == "SelectV2":
            return self._select_on_broadcast_mask(name)
        if op == "LogicalNot" and self._not_comparison(name):
            return True
        if op in INVOLUTIONS:
            return self._involution(name)
        if op in ONE_PIECE:
            return self._one_piece(name)
        if op in MATMULS:
            return self._transpose_into_matmul(name)
        return False

    # ------------------------------------------------------------ negation (exact)
    def _add_of_negation(self, name: str) -> bool:
        x, y = self.graph.inputs(name)
        if self.graph.op(y) == "Neg" and not y.port:
            return self._replace(name, "Sub", [x, self._neg_input(y)], "x + (-y) → x - y")
        if self.graph.op(x) == "Neg" and not x.port:
            return self._replace(name, "Sub", [y, self._neg_input(x)], "(-x) + y → y - x")
        return False

    def _minus_negation(self, name: str) -> bool:
        x, y = self.graph.inputs(name)
        if self.graph.op(y) != "Neg" or y.port:
            return False
        return self._replace(name, "AddV2", [x, self._neg_input(y)], "x - (-y) → x + y")

    def _neg_input(self, ref: Ref) -> Ref:
        return self.graph.inputs(ref.node)[0]

    # ------------------------------------------------------------ comparisons (exact: ints)
    def _not_comparison(self, name: str) -> bool:
        graph = self.graph
        inner = graph.inputs(name)[0]
        op = graph.op(inner)
        if op not in NEGATED or inner.port or graph.reader_count(inner.node) != 1 or \
                inner.node in self.options.protected or graph.control_inputs(inner.node):
            return False
        dtype = graph.node(inner.node).attr["T"].type
        if op not in NAN_SAFE and (dtype in FLOATS or dtype in COMPLEX):
            self.report.skip(name, f"LogicalNot({op}) of floats: not {NEGATED[op]} when an "
                                   "operand is NaN")
            return False
        a, b = graph.inputs(inner.node)[:2]
        attrs = {key: value for key, value in graph.node(inner.node).attr.items()}
        graph.remove([inner.node])
        return self._replace(name, NEGATED[op], [a, b], f"LogicalNot({op}) → {NEGATED[op]}",
                             attrs=attrs)

    # ------------------------------------------------------------ involutions
    def _involution(self, name: str) -> bool:
        graph = self.graph
        inner = graph.inputs(name)[0]
        op = graph.op(name)
        chain = []                      # value-preserving ops between the two, outermost first
        while graph.op(inner) in VALUE_PRESERVING and not inner.port and \
                self._private(inner.node):
            chain.append(inner.node)
            inner = graph.inputs(inner.node)[0]
        if graph.op(inner) != op or inner.port or (chain and not self._private(inner.node)):
            return False
        if not INVOLUTIONS[op] and self.exact:
            self.report.skip(name, f"{op}∘{op}: not bit-exact (--exact)")
            return False
        if not INVOLUTIONS[op]:
            self.reassociated += 1
        why = f"{op}∘{op}" + (f" around {' → '.join(reversed(chain))}" if chain else "") + \
            ("" if INVOLUTIONS[op] else " (not bit-exact)")
        if not chain:
            return self._bypass(name, graph.inputs(inner.node)[0], why)
        graph.set_input(chain[-1], 0, graph.inputs(inner.node)[0])
        graph.remove([inner.node])
        return self._bypass(name, Ref(chain[0]), why)

    def _private(self, name: str) -> bool:
        """Read by one consumer alone, not an output, no control inputs: free to rewrite."""
        return self.graph.reader_count(name) == 1 and name not in self.options.protected and \
            not self.graph.control_inputs(name) and \
            not self.graph.has_control_consumers(name)

    # ------------------------------------------------------------ sums
    def _double(self, name: str) -> bool:
        """p + p → p * 2 where its one reader multiplies it by a constant (c * (p + p) → then
        p * (2c) by the push-down); alone, p * 2 costs a constant more than p + p."""
        x, y = self.graph.inputs(name)
        if x != y:
            return False
        dtype = self.graph.node(name).attr["T"]
        if dtype.type not in INTEGERS | FLOATS:
            return False                       # (strings concatenate; complex: no push-down)
        if not self._private(name):
            return False
        reader = next(iter(self.graph.consumer_nodes(name)))
        if self.graph.op(reader) != "Mul" or self.graph.control_inputs(reader) or \
                not any(self.graph.const_value(ref) is not None
                        for ref in self.graph.inputs(reader)):
            return False
        if self.exact and dtype.type not in INTEGERS:
            return False                       # the push-down would be refused: no gain
        two = self.graph.add_const(f"{name}/two", np.array(2), dtype=dtype.type,
                                   device=self.graph.node(name).device)
        return self._replace(name, "Mul", [x, Ref(two)], "p + p → p * 2")

    def _common_factor(self, name: str) -> bool:
        """x*y1 + y2*x → x*(y1 + y2), y1/x + y2/x → (y1 + y2)/x: one product (quotient) fewer;
        reassociates (not bit-exact)."""
        graph = self.graph
        first, second = graph.inputs(name)
        op = graph.op(first)
        if op not in ("Mul",) + QUOTIENTS or graph.op(second) != op or first.node == second.node:
            return False
        operands = []
        for ref in (first, second):
            if ref.port or graph.reader_count(ref.node) != 1 or \
                    ref.node in self.options.protected or graph.control_inputs(ref.node):
                return False
            operands.append(graph.inputs(ref.node))
        if op == "Mul":
            common = [ref for ref in operands[0] if ref in operands[1]]
        else:
            common = [operands[0][1]] if operands[0][1] == operands[1][1] else []
            if common and graph.node(name).attr["T"].type not in FLOATS | COMPLEX:
                return False                # an integer Div truncates each quotient
        if not common:
            return False
        form = "x*y1 + y2*x → x*(y1 + y2)" if op == "Mul" else "y1/x + y2/x → (y1 + y2)/x"
        if self.exact:
            self.report.skip(name, f"{form} reassociates (--exact)")
            return False
        x = common[0]
        rest = [_other(operands[0], x), _other(operands[1], x)] if op == "Mul" else \
            [operands[0][0], operands[1][0]]
        attrs = {"T": graph.node(name).attr["T"]}
        device = graph.node(name).device
        total = graph.new_node("AddV2", f"{name}/factors", rest, attrs, device=device)
        graph.remove([first.node, second.node])
        self.reassociated += 1
        inputs = [x, Ref(total.name)] if op == "Mul" else [Ref(total.name), x]
        return self._replace(name, op, inputs, f"{form} (reassociated)")

    # ------------------------------------------------------------ constant push-down
    def _push_down_constant(self, name: str) -> bool:
        """c1 + (x + c2) → x + (c1 + c2); c1 * (x * c2) → x * (c1 * c2)."""
        graph = self.graph
        op = graph.op(name)
        family = ADDS if op in ADDS else ("Mul",)
        for position in (0, 1):
            c1_ref, inner = graph.inputs(name)[position], graph.inputs(name)[1 - position]
            c1 = graph.const_value(c1_ref)
            if c1 is None or graph.op(inner) not in family or inner.port or \
                    not self._private(inner.node):
                continue
            for inner_position in (0, 1):
                c2_ref = graph.inputs(inner.node)[inner_position]
                x = graph.inputs(inner.node)[1 - inner_position]
                c2 = graph.const_value(c2_ref)
                if c2 is None or graph.const_value(x) is not None:
                    continue
                return self._combine_constants(name, op, x, inner.node, c1, c2)
        return False

    def _combine_constants(self, name, op, x: Ref, inner: str, c1, c2) -> bool:
        graph = self.graph
        dtype = graph.node(name).attr["T"].type
        if dtype not in INTEGERS | FLOATS or c1.dtype != c2.dtype:
            return False
        exact = dtype in INTEGERS
        form = "c1 + (x + c2) → x + (c1 + c2)" if op in ADDS else "c1 * (x * c2) → x * (c1 * c2)"
        if self.exact and not exact:
            self.report.skip(name, f"{form} reassociates (--exact)")
            return False
        if np.broadcast(c1, c2).size > max(c1.size, c2.size):
            return False                       # the combined constant would be larger
        with np.errstate(all="ignore"):         # integers wrap as TensorFlow's do
            value = np.add(c1, c2) if op in ADDS else np.multiply(c1, c2)
        combined = graph.add_const(f"{name}/constants", np.asarray(value, c1.dtype),
                                   dtype=dtype, device=graph.node(name).device)
        graph.remove([inner])
        if not exact:
            self.reassociated += 1
        return self._replace(name, op, [x, Ref(combined)],
                             form + ("" if exact else " (reassociated)"))

    # ------------------------------------------------------------ a tree of sums as one AddN
    def _sum_tree(self, name: str) -> bool:
        graph = self.graph
        dtype = graph.node(name).attr["T"].type
        if not self.sum_trees or dtype not in INTEGERS | FLOATS | COMPLEX:
            return False
        leaves, inner = [], []

        def expand(ref: Ref, root: bool) -> None:
            if (root or (graph.op(ref) in ADDS + ("AddN",) and not ref.port and
                         self._private(ref.node) and
                         graph.node(ref.node).attr["T"].type == dtype)):
                if not root:
                    inner.append(ref.node)
                for operand in graph.inputs(ref.node):
                    expand(operand, False)
            else:
                leaves.append(ref)

        expand(Ref(name), True)
        if not inner:
            return False
        shape = self.shapes.get(name)
        if shape is None or None in shape or \
                any(ref.port or self.shapes.get(ref.node) != shape for ref in leaves):
            self.report.skip(name, "a tree of sums: the shapes are not all known and equal "
                                   "(AddN does not broadcast)")
            return False
        if self.exact:
            self.report.skip(name, "a tree of sums as one AddN: its order of summation is the "
                                   "kernel's (--exact)")
            return False
        graph.remove(inner)
        self.reassociated += 1
        attrs = {"T": graph.node(name).attr["T"], "N": len(leaves)}
        return self._replace(name, "AddN", leaves, f"a tree of {len(inner) + 1} sums as one AddN "
                             "(reassociated)", attrs=attrs)

    # ------------------------------------------------------------ x * OnesLike, x + ZerosLike
    def _times_ones_like(self, name: str) -> bool:
        return self._neutral_like(name, "OnesLike", exact=True)

    def _plus_zeros_like(self, name: str) -> bool:
        return self._neutral_like(name, "ZerosLike", exact=None)

    def _neutral_like(self, name: str, like: str, exact) -> bool:
        graph = self.graph
        for position in (1, 0):
            ref, x = graph.inputs(name)[position], graph.inputs(name)[1 - position]
            if graph.op(ref) != like:
                continue
            of = graph.inputs(ref.node)[0]
            if of != x and not self._same_static_shape(of, x):
                self.report.skip(name, f"{like} of a tensor whose shape is not known to be "
                                       "x's: the sum or product might broadcast x")
                return False
            dtype = graph.node(name).attr["T"].type
            if exact is None and dtype in FLOATS | COMPLEX:
                if self.exact:
                    self.report.skip(name, "x + ZerosLike(x) → x is not bit-exact for floats "
                                           "(-0 + 0 is +0) (--exact)")
                    return False
                self.reassociated += 1
            return self._bypass(name, x, f"x {'*' if like == 'OnesLike' else '+'} {like}(x)")
        return False

    def _select_on_broadcast_mask(self, name: str) -> bool:
        """``where(ones_like(x) & m, x, y)`` → ``where(m, x, y)`` (Keras' MultiHeadAttention
        broadcasts its padding mask to the scores so): the all-true tensor shaped like x only
        broadcasts m to x's shape, which the select does anyway. Exact, for any shapes."""
        graph = self.graph
        cond, x, y = graph.inputs(name)
        if graph.op(cond) != "LogicalAnd" or cond.port:
            return False
        for position in (0, 1):
            ones, mask = graph.inputs(cond.node)[position], graph.inputs(cond.node)[1 - position]
            if self._all_true_like(ones) in (x, y):
                graph.set_input(name, 0, mask)
                self.report.matched += 1
                self.report.rewritten.append(f"{name}: where(ones_like(x) & m, x, y) → "
                                             "where(m, x, y)")
                return True
        return False

    def _all_true_like(self, ref: Ref):
        """x where ``ref`` is ``OnesLike(x)`` or ``Fill(Shape(x), True)`` (bool); else None."""
        graph = self.graph
        if ref.port:
            return None
        if graph.op(ref) == "OnesLike":
            return graph.inputs(ref.node)[0]
        if graph.op(ref) != "Fill":
            return None
        shape, value = graph.inputs(ref.node)
        fill = graph.const_value(value)
        if fill is None or fill.dtype != np.bool_ or not bool(fill) or \
                graph.op(shape) != "Shape" or shape.port:
            return None
        return graph.inputs(shape.node)[0]

    def _same_static_shape(self, a: Ref, b: Ref) -> bool:
        """Both fully known and equal (the dtypes are equal: both are operands of one op)."""
        first = self.shapes.get(a.node) if not a.port else None
        second = self.shapes.get(b.node) if not b.port else None
        return first is not None and first == second and None not in first

    # ------------------------------------------------------------ one piece
    def _one_piece(self, name: str) -> bool:
        graph = self.graph
        op = graph.op(name)
        if graph.attr(name, "num_split") != 1:
            return False
        return self._bypass(name, graph.inputs(name)[1 if op == "Split" else 0],
                            f"{op} into one piece")

    # ------------------------------------------------------------ Transpose into MatMul
    def _transpose_into_matmul(self, name: str) -> bool:
        graph = self.graph
        op = graph.op(name)
        flags = MATMULS[op]
        for index, flag in enumerate(flags):
            ref = graph.inputs(name)[index]
            if graph.op(ref) != "Transpose" or ref.port:
                continue
            perm = graph.const_value(graph.inputs(ref.node)[1])
            if perm is None:
                continue
            rank = perm.size
            swapped = list(range(rank - 2)) + [rank - 1, rank - 2]
            if rank < 2 or perm.tolist() != swapped or (op == "MatMul" and rank != 2):
                continue
            attrs = graph.node(name).attr      # BatchMatMulV3: one dtype per operand
            dtype = attrs[("Ta", "Tb")[index]].type if "Ta" in attrs else attrs["T"].type
            if op != "MatMul" and dtype in COMPLEX:
                self.report.skip(name, f"{flag} conjugates complex values; a Transpose does not")
                continue
            node = graph.edit_node(name)
            node.attr[flag].b = not graph.attr(name, flag, False)
            graph.set_input(name, index, graph.inputs(ref.node)[0])
            self.report.matched += 1
            self.report.rewritten.append(f"{name}: Transpose of input {index} as {flag}")
            return True
        return False

    # ------------------------------------------------------------ graph edits
    def _replace(self, name: str, op: str, inputs, why: str, attrs=None) -> bool:
        """``name`` becomes ``op(inputs)`` under the same name (readers and outputs unchanged)."""
        graph = self.graph
        node = graph.node(name)
        attrs = attrs if attrs is not None else {"T": node.attr["T"]}
        device = node.device
        graph.remove([name])
        graph.new_node(op, name, inputs, attrs, device=device)
        self.report.matched += 1
        self.report.rewritten.append(f"{name}: {why}")
        return True

    def _bypass(self, name: str, source: Ref, why: str) -> bool:
        """Readers of ``name`` read ``source`` instead; an output keeps its name as an Identity."""
        graph = self.graph
        node = graph.node(name)
        dtype = attr_value_pb2.AttrValue(type=node.attr["T"].type if "T" in node.attr
                                         else types_pb2.DT_BOOL)       # LogicalNot has no T
        graph.bypass(name, source, keep_name_as=dtype if name in self.options.protected else None)
        self.report.matched += 1
        self.report.rewritten.append(f"{name}: {why}")
        return True


def _other(pair, ref: Ref) -> Ref:
    """The operand of a two-input product that is not ``ref`` (``ref`` itself for x*x)."""
    return pair[1] if pair[0] == ref else pair[0]


def adds_of_add_n(graph_def):
    """``graph_def`` with every ``AddN`` of two or more inputs as a left-to-right chain of
    ``AddV2``s (the last one keeps the AddN's name): for converters without an int8 ``ADD_N``.
    The caller's GraphDef is not changed."""
    if not any(node.op == "AddN" for node in graph_def.node):
        return graph_def
    graph = Graph(graph_def)
    for name in graph.names_with_ops(("AddN",)):
        node = graph.node(name)
        data = [ref for ref in graph.input_refs(name) if not ref.control]
        control = [ref for ref in graph.input_refs(name) if ref.control]
        if len(data) < 2:
            continue
        attrs, device = {"T": node.attr["T"]}, node.device
        total = data[0]
        for index, ref in enumerate(data[1:-1], start=1):
            total = Ref(graph.new_node("AddV2", f"{name}/sum_{index}", [total, ref], attrs,
                                       device=device).name)
        graph.remove([name])
        graph.new_node("AddV2", name, [total, data[-1]] + control, attrs, device=device)
    return graph.to_graph_def()
