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
- Involutions: ``LogicalNot(LogicalNot(x))``, ``Conj(Conj(x))`` → ``x``: exact.
  ``Reciprocal(Reciprocal(x))`` → ``x``: not bit-exact (``1/(1/x)`` rounds twice; subnormal ``x``
  becomes Inf) — only without ``exact``.
- ``Add(p, p)`` → ``p * 2``: exact (doubling is exact, overflow gives the same Inf).
- ``x*y1 + y2*x`` → ``x * (y1 + y2)``: reassociating, not bit-exact — only without ``exact``; both
  products read by the sum alone.
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
INVOLUTIONS = {"LogicalNot": True, "Conj": True, "Reciprocal": False}   # op → exact
ONE_PIECE = ("Split", "SplitV")
MATMULS = {"MatMul": ("transpose_a", "transpose_b"), "BatchMatMul": ("adj_x", "adj_y"),
           "BatchMatMulV2": ("adj_x", "adj_y"), "BatchMatMulV3": ("adj_x", "adj_y")}
FLOATS = {types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE}
COMPLEX = {types_pb2.DT_COMPLEX64, types_pb2.DT_COMPLEX128}
RULE_OPS = frozenset(ADDS) | {"Sub", "Mul", "LogicalNot"} | frozenset(INVOLUTIONS) | \
    frozenset(ONE_PIECE) | frozenset(MATMULS)
MAX_ROUNDS = 10


@dataclasses.dataclass
class SimplifyAlgebraParams:
    exact: bool = False     # only rewrites that are bit-exact in IEEE arithmetic (--exact)


@transform("simplify-algebra", repeat=True, params=SimplifyAlgebraParams)
def simplify_algebra(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("simplify-algebra")
    rules = _Rules(graph, options, report, options.params_for(simplify_algebra).exact)
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

    def apply(self, name: str) -> bool:
        graph = self.graph
        op = graph.op(name)
        if graph.control_inputs(name):
            return False
        if op in ADDS:
            return self._add_of_negation(name) or self._double(name) or \
                self._plus_zeros_like(name) or self._common_factor(name)
        if op == "Sub":
            return self._minus_negation(name)
        if op == "Mul":
            return self._times_ones_like(name)
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
        if graph.op(inner) != op or inner.port:
            return False
        if not INVOLUTIONS[op] and self.exact:
            self.report.skip(name, f"{op}∘{op}: not bit-exact (--exact)")
            return False
        if not INVOLUTIONS[op]:
            self.reassociated += 1
        return self._bypass(name, graph.inputs(inner.node)[0], f"{op}∘{op}" +
                            ("" if INVOLUTIONS[op] else " (not bit-exact)"))

    # ------------------------------------------------------------ sums
    def _double(self, name: str) -> bool:
        """p + p → p * 2: exact."""
        x, y = self.graph.inputs(name)
        if x != y:
            return False
        dtype = self.graph.node(name).attr["T"]
        if dtype.type == types_pb2.DT_STRING:
            return False                       # Add of strings concatenates
        two = self.graph.add_const(f"{name}/two", np.array(2), dtype=dtype.type,
                                   device=self.graph.node(name).device)
        return self._replace(name, "Mul", [x, Ref(two)], "p + p → p * 2")

    def _common_factor(self, name: str) -> bool:
        """x*y1 + y2*x → x*(y1 + y2): one product fewer; reassociates (not bit-exact)."""
        graph = self.graph
        first, second = graph.inputs(name)
        products = []
        for ref in (first, second):
            if graph.op(ref) != "Mul" or ref.port or graph.reader_count(ref.node) != 1 or \
                    ref.node in self.options.protected or graph.control_inputs(ref.node):
                return False
            products.append(graph.inputs(ref.node))
        common = [ref for ref in products[0] if ref in products[1]]
        if not common or first.node == second.node:
            return False
        if self.exact:
            self.report.skip(name, "x*y1 + y2*x → x*(y1 + y2) reassociates (--exact)")
            return False
        x = common[0]
        rest = [_other(products[0], x), _other(products[1], x)]
        attrs = {"T": graph.node(name).attr["T"]}
        device = graph.node(name).device
        total = graph.new_node("AddV2", f"{name}/factors", rest, attrs, device=device)
        graph.remove([first.node, second.node])
        self.reassociated += 1
        return self._replace(name, "Mul", [x, Ref(total.name)],
                             "x*y1 + y2*x → x*(y1 + y2) (reassociated)")

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
        if name in self.options.protected:
            graph.remove([name])
            graph.new_node("Identity", name, [source], {"T": dtype}, device=node.device)
        else:
            graph.rewire(name, source)
            graph.move_control_consumers(name, source.node)
            graph.remove([name])
        self.report.matched += 1
        self.report.rewritten.append(f"{name}: {why}")
        return True


def _other(pair, ref: Ref) -> Ref:
    """The operand of a two-input product that is not ``ref`` (``ref`` itself for x*x)."""
    return pair[1] if pair[0] == ref else pair[0]
