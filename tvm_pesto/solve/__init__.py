"""Stage 4: placement solvers. Each is ``solve(problem, **options) -> Plan``.

``SOLVERS`` maps a name to its solve function: the heuristics of
:mod:`tvm_pesto.solve.portfolio`, ``stage-dp``, and ``ilp`` (also ``auto`` on a placement problem), which is imported from
:mod:`tvm_pesto.solve.ilp` on first use, so the heuristics work without PuLP.
The registry lives in :mod:`tvm_pesto.solve.registry`; nothing inside this package
imports this ``__init__``.

Modules: ``budget`` (how much a solver may do: wall-clock budgets, or work budgets in
deterministic mode), ``common`` (shared heuristic machinery), ``single``, ``heft``, ``mtopo``, ``metf``,
``msct`` (heuristics), ``portfolio`` (all heuristics, best plan), ``mip`` (what both ILPs
share: variables, solver backends, real solver status), ``ilp_model`` (the placement MIP),
``ilp_constraints`` (its constraint families), ``ilp_warm`` (its warm start), ``ilp_solve`` (the
MIP solved from a warm start), ``coarsen`` (supernodes), ``coarse_ilp`` (the MIP on supernodes),
``bounds`` / ``comm_bounds`` (lower bounds), ``refine`` (local search), ``polish`` (it from
several starts), ``lns`` (MIP windows of a schedule), ``ilp`` (the registry's ILP:
coarsen, solve, LNS, refine), ``ideal_dp`` (contiguous splits by DP over ideals, and its bound),
``stage_dp`` (the ``stage-dp`` solver built on it), ``stage_model`` (the stage model's MIP),
``stage_ilp`` (it solved from the best start), ``stage_bounds`` (the stage model's chain bound on
latency), ``objective_bounds`` (bounds for every model and objective),
``cover`` (Collage's covering search), ``joint_ilp`` (backend + device + order MIP),
``joint_relaxation`` (backend + device MIP on whole graphs, with a proven bound), ``joint_decide``
(the ILPs' step of the joint solve: which plan decides, its gap),
``joint_search`` (local search over backend and device) and ``joint`` (the flow's solver:
cover, placement, joint search), ``registry`` (solvers by name).

Examples
--------
>>> from tvm_pesto.solve import SOLVERS, get_solver
>>> sorted(SOLVERS)
['auto', 'heft', 'ilp', 'm-etf', 'm-sct', 'm-topo', 'single', 'stage-dp']
"""
from __future__ import annotations

from .bounds import lower_bound
from .registry import HEURISTICS, SOLVERS, get_solver, solve

__all__ = ["HEURISTICS", "SOLVERS", "get_solver", "lower_bound", "solve"]
