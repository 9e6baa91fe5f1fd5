"""TVM's registered BYOC patterns (cuBLAS, cuDNN, TensorRT) for tvm-pesto's backends.

What each library accepts is taken from TVM's own pattern tables
(``tvm.relax.backend.cuda.cublas`` / ``.cudnn`` and ``tvm.relax.backend.contrib.tensorrt``),
never rewritten here. Two uses:

- :func:`backend_patterns` turns them into the ``(name, pattern, check)`` entries of
  :class:`tvm_pesto.backends.base.Backend`; the check runs TVM's own check function on a
  small stand-in for TVM's ``PatternCheckContext``.
- :func:`match_nodes` / :func:`merged_regions` match them on a graph with TVM's check
  functions, as ``FuseOpsByPattern`` does, and report the matched node ids (coverage).

Examples
--------
>>> from tvm_pesto.backends.gpu.patterns import registry_patterns
>>> len(registry_patterns("cublas")) > 0
True
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import tvm
from tvm import relax

from ...errors import PestoError, error_line
from ...graph.regions import convex_regions
from ..patterns import CHECK_READ_ERRORS

LIBRARIES = ("cublas", "cudnn", "tensorrt")


@functools.lru_cache(maxsize=None)
def _load_tables() -> None:
    import tvm.relax.backend.contrib.tensorrt  # noqa: F401 - registers "tensorrt.*"
    import tvm.relax.backend.cuda.cublas  # noqa: F401 - registers "cublas.*"
    import tvm.relax.backend.cuda.cudnn  # noqa: F401 - registers "cudnn.*"


def registry_patterns(prefix: str) -> list:
    """TVM's ``FusionPattern`` list for ``prefix`` (highest priority first).

    Examples
    --------
    >>> names = [p.name for p in registry_patterns("cudnn")]
    >>> "cudnn.conv2d.nhwc_ohwi_bias_relu" in names
    True
    """
    from tvm.relax.backend.pattern_registry import get_patterns_with_prefix

    _load_tables()
    return list(get_patterns_with_prefix(prefix))


class _CheckContext:
    """Duck-typed ``PatternCheckContext`` built from a tvm-pesto ``MatchContext``.

    ``matched_bindings``/``var_usages`` are empty: whether intermediate values leak out of
    the match is decided by tvm-pesto's candidate generator (single-exit rule), so TVM's
    ``has_leaking_intermediate_variables`` sees no intermediates here.
    """

    def __init__(self, ctx, annotations):
        self.matched_expr = ctx.root
        self.annotated_expr = {}
        items = list(ctx.matched.items())
        for name, pat in annotations.items():
            for p, e in items:
                if p.same_as(pat):
                    self.annotated_expr[name] = e
                    break
        self.matched_bindings = {}
        self.var_usages = {}
        self.value_to_bound_var = {ctx.root: None}


def _adapt(fp):
    check = fp.check
    annotations = dict(fp.annotation_patterns)

    def run_check(ctx) -> bool:
        # what TVM's check raises reaches the candidate generator, which tells a call the
        # check cannot read (a no) from a failure (tvm_pesto.candidates.checks.BackendChecks)
        return check is None or bool(check(_CheckContext(ctx, annotations)))

    run_check.__name__ = f"check_{fp.name.replace('.', '_')}"
    return run_check


def backend_patterns(prefix: str) -> list[tuple]:
    """``[(name, pattern, check), ...]`` for :meth:`Backend.patterns`, from TVM's registry.

    Examples
    --------
    >>> entries = backend_patterns("cublas")
    >>> entries[0][0].startswith("cublas.") and callable(entries[0][2])
    True
    """
    return [(fp.name, fp.pattern, _adapt(fp)) for fp in registry_patterns(prefix)]


def ops_in_patterns(prefix: str) -> set[str]:
    """Relax op names (``relax.nn.conv2d``...) that appear in the library's patterns."""
    from tvm.relax.dpl.pattern import CallPattern, ExprPattern

    out: set[str] = set()

    def walk(p, seen):
        if id(p) in seen:
            return
        seen.add(id(p))
        if isinstance(p, CallPattern):
            op = p.op
            if isinstance(op, ExprPattern) and isinstance(op.expr, tvm.ir.Op):
                out.add(op.expr.name)
            for a in p.args:
                walk(a, seen)
        for attr in ("left", "right", "pattern", "tuple"):
            sub = getattr(p, attr, None)
            if sub is not None and hasattr(sub, "same_as"):
                walk(sub, seen)
        for f in getattr(p, "fields", None) or []:
            walk(f, seen)

    for fp in registry_patterns(prefix):
        walk(fp.pattern, set())
    return out


# -- coverage on a graph ----------------------------------------------------------------
@dataclass(frozen=True)
class PatternMatch:
    """One match of a library pattern: its name and the op-graph node ids it covers."""

    pattern: str
    nodes: tuple[int, ...]


class _FullCheckContext:
    """A complete stand-in for TVM's ``PatternCheckContext`` of one match in ``main``
    (so TVM's leak check and every library check run exactly as in ``FuseOpsByPattern``)."""

    def __init__(self, root, annotated, matched_bindings, var_usages, value_to_bound_var):
        self.matched_expr = root
        self.annotated_expr = annotated
        self.matched_bindings = matched_bindings
        self.var_usages = var_usages
        self.value_to_bound_var = value_to_bound_var


def match_nodes(rg, prefix: str) -> list[PatternMatch]:
    """Which nodes of a graph TVM's ``prefix`` patterns match, with TVM's check functions.

    Roots are visited from the last binding to the first and, at each root, the patterns
    in TVM's priority order; the first match whose nodes are all unclaimed and whose
    check passes (given the same context ``FuseOpsByPattern`` builds: matched bindings,
    variable uses, value-to-variable map) claims its nodes. Visiting consumers first lets
    ``matmul + bias + gelu`` claim the ``matmul`` before a bare ``matmul`` pattern could.

    Parameters
    ----------
    rg : RelaxGraph
        From :func:`tvm_pesto.graph.relax_import.from_relax`.
    prefix : {"cublas", "cudnn", "tensorrt"}

    Returns
    -------
    list of PatternMatch
        One per match, in program order of the root.

    Raises
    ------
    PestoError
        When a check raises anything but what a check that cannot read a call raises
        (:data:`tvm_pesto.backends.patterns.CHECK_READ_ERRORS`, taken as a no), as
        ``FuseOpsByPattern`` would let it through.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> from tvm_pesto.graph.relax_import import from_relax
    >>> ms = match_nodes(from_relax(tiny_mlp()[0]), "cublas")
    >>> [(m.pattern, m.nodes) for m in ms][:2]
    [('cublas.matmul_bias_gelu', (1, 2, 3)), ('cublas.matmul', (4,))]
    """
    from tvm.relax.dpl.pattern import CallPattern

    pats = registry_patterns(prefix)
    var2val = relax.analysis.get_var2val(rg.func)
    call_node = {}
    for v, k in enumerate(rg.node_binding):
        call_node[rg.bindings[k].value] = v
    value_to_var = {b.value: b.var for b in rg.bindings}
    usages: dict = {}
    for b in rg.bindings:
        for u in relax.analysis.free_vars(b.value):
            usages.setdefault(u, []).append(b.var)
    ret = rg.func.body.body
    for u in ([ret] if isinstance(ret, relax.Var) else relax.analysis.free_vars(ret)):
        usages.setdefault(u, []).append(relax.Var("__return__", u.ty))  # used outside the body
    claimed: set[int] = set()
    found = []
    for root in reversed(range(rg.graph.num_nodes)):
        if root in claimed:
            continue
        b = rg.bindings[rg.node_binding[root]]
        call = b.value
        if not isinstance(call, relax.Call):
            continue
        for fp in pats:
            if not fp.pattern.match(call, var2val):
                continue
            matched = fp.pattern.extract_matched_expr(call, var2val)
            items = list(matched.items())
            members = {call_node[e] for p, e in items if isinstance(p, CallPattern) and e in call_node}
            if root not in members or members & claimed:
                continue
            annotated = {}
            for name, ap in dict(fp.annotation_patterns).items():
                for p, e in items:
                    if p.same_as(ap):
                        annotated[name] = e
                        break
            mb = {rg.bindings[rg.node_binding[v]].var: rg.bindings[rg.node_binding[v]].value for v in members}
            ctx = _FullCheckContext(call, annotated, mb, usages, value_to_var)
            try:
                ok = fp.check is None or bool(fp.check(ctx))
            except CHECK_READ_ERRORS:  # a check that cannot read this match says no
                ok = False
            except Exception as e:
                op_name = getattr(call.op, "name", call.op)
                raise PestoError(f"TVM's check of pattern {fp.name!r} raised on node {root} ({op_name}): "
                                 f"{error_line(e)}; the check or the TVM API it reads has changed") from e
            if ok:
                claimed |= members
                found.append(PatternMatch(fp.name, tuple(sorted(members))))
                break
    found.sort(key=lambda m: m.nodes[-1])
    return found


def merged_regions(rg, prefix: str) -> list[PatternMatch]:
    """Matched nodes merged into maximal convex, connected regions (how TensorRT
    partitions a graph, like TVM's ``MergeCompositeFunctions``)."""
    supported = {v for m in match_nodes(rg, prefix) for v in m.nodes}
    return [PatternMatch(f"{prefix}.region", tuple(r)) for r in convex_regions(rg.graph, supported)]


def coverage(rg, prefixes=LIBRARIES) -> dict[str, dict]:
    """Per library: matched node count, per-pattern counts and node ids.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_cnn
    >>> from tvm_pesto.graph.relax_import import from_relax
    >>> cov = coverage(from_relax(tiny_cnn()[0]))
    >>> cov["cudnn"]["nodes"], cov["cublas"]["per_pattern"]
    ([0, 3, 4, 8], {'cublas.matmul_bias': 1})
    """
    out = {}
    for p in prefixes:
        ms = match_nodes(rg, p)
        per: dict[str, int] = {}
        for m in ms:
            per[m.pattern] = per.get(m.pattern, 0) + 1
        covered = sorted({v for m in ms for v in m.nodes})
        out[p] = {"matches": len(ms), "nodes": covered, "per_pattern": per}
    return out
