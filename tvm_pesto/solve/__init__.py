"""Stage 4: placement solvers. Each is ``solve(problem, **options) -> Plan``.

``SOLVERS`` maps a name to its solve function: the heuristics of
:mod:`tvm_pesto.solve.heuristics.portfolio`, ``stage-dp``, and ``ilp`` (also ``auto`` on a
placement problem), which is imported from :mod:`tvm_pesto.solve.placement_ilp.driver` on first
use, so the heuristics work without PuLP.
The registry lives in :mod:`tvm_pesto.solve.registry`; nothing inside this package
imports this ``__init__``.

Layout, one concept per folder:

* the core, here: ``budget`` (how much a solver may do: wall-clock budgets, or work budgets
  in deterministic mode), ``mip`` (what every MIP shares: variables, solver backends, real
  solver status), ``registry`` (solvers by name); ``split`` and ``build_budget`` serve the
  final choice (the flow's split decision, the plan's build-time budget);
* :mod:`.heuristics`: the list-scheduling heuristics and their portfolio;
* :mod:`.placement_ilp`: the op model's MIP (``model/``), solved from a warm start, on
  supernodes (coarsening), in windows (LNS), with local search (refine, polish), and its
  ``driver`` (the registry's ``ilp``);
* :mod:`.stage`: the stage model (contiguous pipeline stages): its DP, MIP and bound;
* :mod:`.joint`: backend + device chosen together (Collage's cover, the joint MIPs, joint
  search, the flow's solver);
* :mod:`.bounds`: lower bounds on any plan of a placement problem (makespan, transfers, every
  model and objective).

Examples
--------
>>> from tvm_pesto.solve import SOLVERS, get_solver
>>> sorted(SOLVERS)
['auto', 'heft', 'ilp', 'm-etf', 'm-sct', 'm-topo', 'single', 'stage-dp']
"""
from __future__ import annotations

from .bounds.makespan import lower_bound
from .registry import HEURISTICS, SOLVERS, get_solver, solve

__all__ = ["HEURISTICS", "SOLVERS", "get_solver", "lower_bound", "solve"]
