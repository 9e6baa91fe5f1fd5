"""A plan: which device runs each node, and in which order each device runs its nodes.

A plan is plain data. It prints as a text grid, serialises to JSON, and together with a
simulation result exports a Chrome trace (``chrome://tracing`` / Perfetto) and a Gantt PNG.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..errors import GraphError, PlanError
from ..jsonio import write_json


@dataclass
class Plan:
    """Placement + per-device order.

    Parameters
    ----------
    assignment : array of int, shape (num_nodes,)
        Device index of each node.
    order : list of list of int
        ``order[d]`` lists the nodes device ``d`` runs, in the order it runs them.
    solver : str
        Name of the algorithm that produced the plan.
    solve_s : float
        Wall-clock seconds the algorithm took.
    info : dict
        Solver-specific facts (MIP gap, status, lower bound, ...).
    units : list of Candidate, optional
        For a plan of a module: what plan node ``k`` runs, ``units[k].backend`` on the op
        graph nodes ``units[k].nodes`` (the candidates the solver chose). The builder
        lowers exactly these units. ``None`` for plans of graphs that are not modules
        (imported layer graphs, random DAGs).
    """

    assignment: np.ndarray
    order: list[list[int]]
    solver: str = "unknown"
    solve_s: float = 0.0
    info: dict = field(default_factory=dict)
    units: list | None = None

    def __post_init__(self):
        self.assignment = np.asarray(self.assignment, dtype=np.int32)
        self.order = [list(map(int, o)) for o in self.order]

    @property
    def num_devices(self) -> int:
        return len(self.order)

    @classmethod
    def from_assignment(cls, assignment, priority, num_devices: int, **kw) -> "Plan":
        """Order each device's nodes by ``priority`` (a topological position per node)."""
        assignment = np.asarray(assignment, dtype=np.int32)
        pr = np.asarray(priority)
        order = [sorted(np.flatnonzero(assignment == d).tolist(), key=lambda v: (pr[v], v))
                 for d in range(num_devices)]
        return cls(assignment, order, **kw)

    def validate(self, num_nodes: int, num_devices: int) -> None:
        """Check that every node is placed once and the orders agree with the assignment."""
        if self.assignment.shape != (num_nodes,):
            raise PlanError(f"plan assigns {self.assignment.shape[0]} nodes; the graph has {num_nodes}")
        if len(self.order) != num_devices:
            raise PlanError(f"plan has orders for {len(self.order)} devices; the cluster has {num_devices}")
        if num_nodes and (self.assignment.min() < 0 or self.assignment.max() >= num_devices):
            raise PlanError(f"plan assigns a device outside 0..{num_devices - 1}")
        sizes = [len(seq) for seq in self.order]
        flat = (np.concatenate([np.asarray(seq, dtype=np.int64).reshape(-1) for seq in self.order])
                if sum(sizes) else np.zeros(0, dtype=np.int64))
        dev = np.repeat(np.arange(num_devices), sizes)
        out = (flat < 0) | (flat >= num_nodes)
        if out.any():
            i = int(np.flatnonzero(out)[0])
            raise PlanError(f"device {dev[i]}'s order names unknown node {flat[i]}")
        wrong = self.assignment[flat] != dev
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            raise PlanError(f"node {flat[i]} is in device {dev[i]}'s order but assigned to {self.assignment[flat[i]]}")
        seen = np.bincount(flat, minlength=num_nodes)
        if (seen != 1).any():
            bad = int(np.flatnonzero(seen != 1)[0])
            raise PlanError(f"node {bad} appears {seen[bad]} times in the orders; each node needs exactly one slot")

    def devices_used(self) -> list[int]:
        return [d for d, seq in enumerate(self.order) if seq]

    def backend_mix(self) -> dict[str, int]:
        """Backend -> number of op-graph nodes it runs (empty for plans without units)."""
        out: dict[str, int] = {}
        for u in self.units or []:
            out[u.backend] = out.get(u.backend, 0) + len(u.nodes)
        return dict(sorted(out.items()))

    # -- output ------------------------------------------------------------------------
    def to_dict(self, graph=None) -> dict:
        names = (lambda v: graph.nodes[v].name) if graph is not None else str
        out = {
            "solver": self.solver,
            "solve_s": self.solve_s,
            "assignment": {names(v): int(d) for v, d in enumerate(self.assignment)},
            "order": [[names(v) for v in seq] for seq in self.order],
            "info": self.info,
        }
        if self.units is not None:
            out["units"] = [{"backend": u.backend, "nodes": [int(v) for v in u.nodes], "pattern": u.pattern}
                            for u in self.units]
            out["backend_mix"] = self.backend_mix()
        return out

    def to_text(self, graph=None, sim=None, width: int = 100) -> str:
        """A text grid: one row per device, ops in order, with times when ``sim`` is given."""
        lines = [f"plan by {self.solver} ({self.solve_s:.3f} s)"
                 + (f", makespan {sim.makespan * 1e3:.3f} ms" if sim is not None else "")]
        for d, seq in enumerate(self.order):
            cells = []
            for v in seq:
                label = graph.nodes[v].name if graph is not None else str(v)
                if sim is not None:
                    label += f"[{sim.start[v] * 1e3:.2f}-{sim.finish[v] * 1e3:.2f}]"
                cells.append(label)
            row = f"dev{d} ({len(seq)} ops): " + " | ".join(cells)
            if len(row) > width:
                row = row[: width - 3] + "..."
            lines.append(row)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def save(self, path: str, graph=None) -> None:
        """Write :meth:`to_dict` as JSON (whole or not at all); :meth:`load` reads it back."""
        write_json(path, self.to_dict(graph))

    # -- input -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data, graph=None, where: str = "the plan") -> "Plan":
        """The inverse of :meth:`to_dict`: node ``k`` is the ``k``-th key of ``assignment``
        (names or numbers, whichever ``to_dict`` wrote), ``units`` become candidates.

        Parameters
        ----------
        data : dict
            What :meth:`to_dict` returned (or :meth:`save` wrote).
        graph : OpGraph, optional
            The graph the plan is to be used for. For a plan with units, the module's op
            graph (``tvm_pesto.analyze(mod).op_graph``): the units must cover it and, when the
            plan was saved with node names, contract to nodes of the same names. For other
            plans, the plan's own graph: same nodes, same names.
        where : str
            How messages name the plan (e.g. its file).

        Raises
        ------
        PlanError
            When ``data`` is not a plan, is inconsistent, or is for another graph (the message
            names the first difference and says to place the graph again).

        Examples
        --------
        >>> p = Plan([0, 1, 0], [[0, 2], [1]], solver="heft")
        >>> q = Plan.from_dict(p.to_dict())
        >>> q.assignment.tolist(), q.order, q.solver
        ([0, 1, 0], [[0, 2], [1]], 'heft')
        """
        if not isinstance(data, dict) or not isinstance(data.get("assignment"), dict) \
                or not isinstance(data.get("order"), list):
            raise PlanError(f"{where} is not a tvm-pesto plan: it needs an 'assignment' object and an 'order' "
                            "list, as Plan.save writes them; save the plan again")
        names = [str(k) for k in data["assignment"]]
        index = {nm: k for k, nm in enumerate(names)}
        try:
            assignment = [int(d) for d in data["assignment"].values()]
            order = [[index[str(nm)] for nm in seq] for seq in data["order"]]
            units = None
            if data.get("units") is not None:
                # lazy: loads TVM's compiler, which importing this module does not
                from ..candidates.generate import Candidate

                units = [Candidate(str(u["backend"]), tuple(int(v) for v in u["nodes"]), str(u.get("pattern", "")))
                         for u in data["units"]]
            plan = cls(np.asarray(assignment, dtype=np.int32), order, solver=str(data.get("solver", "unknown")),
                       solve_s=float(data.get("solve_s", 0.0)), info=dict(data.get("info") or {}), units=units)
        except KeyError as e:
            raise PlanError(f"{where}: a device order names node {e.args[0]!r}, which its assignment does not "
                            "place; the file is damaged: save the plan again") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise PlanError(f"{where} has a malformed field ({type(e).__name__}: {e}); devices and unit nodes are "
                            "integers: save the plan again") from None
        try:
            plan.validate(len(names), len(order))
            if units is not None and len(units) != len(names):
                raise PlanError(f"it has {len(units)} units for {len(names)} plan nodes")
        except PlanError as e:
            raise PlanError(f"{where} is inconsistent: {e}; save the plan again") from None
        if graph is not None:
            plan._check_graph(graph, names, where)
        return plan

    @classmethod
    def load(cls, path: str, graph=None) -> "Plan":
        """Read a plan written by :meth:`save` (see :meth:`from_dict` for ``graph``).

        Raises
        ------
        PlanError
            For a missing or unreadable file, or a plan that does not fit ``graph``.
        """
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise PlanError(f"plan file {path!r} does not exist; check the path, or write one with "
                            "Plan.save(path)") from None
        except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise PlanError(f"plan file {path!r} is not valid JSON ({e}); save the plan again "
                            "(Plan.save writes it whole)") from None
        return cls.from_dict(data, graph, where=f"plan file {path!r}")

    def _check_graph(self, graph, names: list[str], where: str) -> None:
        """Raise :class:`PlanError` if the plan does not fit ``graph`` (see :meth:`from_dict`)."""
        fix = f"place {graph.name!r} again (tvm_pesto.place) or load the plan saved for it"
        n = graph.num_nodes
        if self.units is not None:
            covered = sorted(v for u in self.units for v in u.nodes)
            if covered != list(range(n)):
                raise PlanError(f"{where} is for another graph: its units cover {len(covered)} ops (ids up to "
                                f"{max(covered, default=-1)}), but {graph.name!r} has {n} ops; {fix}")
            try:
                plan_graph = graph.contract([list(u.nodes) for u in self.units])
            except GraphError as e:
                raise PlanError(f"{where} is for another graph: its units do not form a plan of {graph.name!r} "
                                f"({e}); {fix}") from None
        else:
            plan_graph = graph
        if plan_graph.num_nodes != len(names):
            raise PlanError(f"{where} is for another graph: it places {len(names)} nodes, but {graph.name!r} has "
                            f"{plan_graph.num_nodes}; {fix}")
        if names == [str(k) for k in range(len(names))]:
            return  # saved without names: nothing more to compare
        for k, (saved, nd) in enumerate(zip(names, plan_graph.nodes)):
            if saved != nd.name:
                raise PlanError(f"{where} is for another graph: its node {k} is {saved!r}, but in {graph.name!r} "
                                f"node {k} is {nd.name!r}; {fix}")
