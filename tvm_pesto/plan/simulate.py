"""Replay a plan on a cluster: makespan, per-device busy time, memory, transfers.

The work is done by the C++ core (``tvm_pesto._core``); :mod:`.reference` is the
pure-Python specification it is tested against, and is used only when the core is not
built (a source checkout without ``pip install``), with a warning.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..cluster.contention import contention_factors
from ..cluster.dispatch import dispatch_info, dispatch_s, switch_figures
from ..errors import InfeasibleError
from .plan import Plan
from .problem import Problem
from .reference import SimArrays, simulate_reference


@dataclass
class SimResult:
    """What a simulated run of a plan looks like.

    ``transfers`` has one row per cross-device transfer:
    ``(producer, src_dev, dst_dev, start_s, end_s, bytes)``. ``makespan`` is the schedule's
    (what the solvers minimise); ``run_s`` adds what one run of the placed module pays
    around it: ``io_s``, moving the inputs from and the result to the home device
    (:data:`HOME_DEVICE`) when nodes run elsewhere, and ``dispatch_s``, the executor's cost
    per run (:mod:`tvm_pesto.cluster.dispatch`). ``switches`` counts the changes of backend
    between consecutive units of a device and ``switch_s`` is what they add to the units'
    durations in the schedule (:func:`switch_charges`; inside ``makespan``, not beside it).
    """

    start: np.ndarray
    finish: np.ndarray
    makespan: float
    busy: np.ndarray
    peak_memory: np.ndarray
    transfers: np.ndarray
    slowdown: np.ndarray | None = None  # per node, from contention between devices of a host
    dispatch_s: float = 0.0  # the executor's cost per run for the devices the plan uses
    io_s: float = 0.0  # inputs from, and the result back to, the home device
    switches: int = 0  # changes of backend between consecutive units of a device
    switch_s: float = 0.0  # the seconds those switches add to the units' durations (in the schedule)

    @property
    def run_s(self) -> float:
        """Predicted seconds of one run: the makespan, the home device's input and result
        transfers, and the executor's dispatch."""
        return self.makespan + self.io_s + self.dispatch_s

    def summary(self) -> dict:
        out = {
            "makespan_s": float(self.makespan),
            "io_s": float(self.io_s),
            "dispatch_s": float(self.dispatch_s),
            "switches": int(self.switches),
            "switch_s": float(self.switch_s),
            "run_s": float(self.run_s),
            "busy_s": self.busy.tolist(),
            "peak_memory_bytes": self.peak_memory.tolist(),
            "num_transfers": int(len(self.transfers)),
            "transfer_bytes": float(self.transfers[:, 5].sum()) if len(self.transfers) else 0.0,
        }
        if self.slowdown is not None:
            out["contention_max_slowdown"] = float(self.slowdown.max()) if len(self.slowdown) else 1.0
        return out


_warned = False


def _core():
    try:
        # lazy: the C++ core library (tvm-ffi) loads on first use
        from .. import _core  # type: ignore[attr-defined]

        return _core
    except ImportError:
        return None


#: The device a placed module takes its inputs on and returns its result on
#: (:func:`tvm_pesto.builder.rewrite.apply_plan`).
HOME_DEVICE = 0


def home_io_s(problem: Problem, assignment: np.ndarray, finish: np.ndarray, makespan: float) -> float:
    """Seconds a run spends moving data to and from :data:`HOME_DEVICE` beyond the schedule:
    the executor copies each input a node elsewhere reads before any device starts (one
    after another, in the caller), and each result made elsewhere back after it is made.

    A node's input bytes are what it reads that is neither a weight nor an edge from another
    node (``bytes_read - param_bytes -`` its in-edges); a result is a node without successors.

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("a", "relax.add", bytes_read=4096, bytes_written=1024)], [])
    >>> p = Problem(g, parse_cluster("cpu:2"), np.ones((1, 2)))
    >>> home_io_s(p, np.array([0]), np.array([1.0]), 1.0)
    0.0
    >>> round(home_io_s(p, np.array([1]), np.array([1.0]), 1.0) * 1e6, 2)   # 30 us each way, plus bytes
    60.34
    """
    n = problem.num_nodes
    away = np.flatnonzero(np.asarray(assignment[:n]) != HOME_DEVICE) if n else np.zeros(0, dtype=int)
    if not len(away):
        return 0.0
    external, has_succ = _external_io(problem)
    pre, end = 0.0, makespan
    for v in away:
        d, nd = int(assignment[v]), problem.graph.nodes[v]
        ext = external[v]
        if ext > 0:
            pre += problem.transfer_s(HOME_DEVICE, d, ext)
        if not has_succ[v]:
            end = max(end, float(finish[v] + problem.latency[d, HOME_DEVICE]
                                 + nd.output_bytes * problem.inv_bw[d, HOME_DEVICE]))
    return pre + end - makespan


def _external_io(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the input bytes it reads from outside the graph (``bytes_read`` less its
    weights and its in-edges), and whether it has successors (a node without is a result)."""
    n = problem.num_nodes
    in_edge = np.zeros(n)
    np.add.at(in_edge, problem.dst, problem.ebytes)
    has_succ = np.zeros(n, dtype=bool)
    has_succ[problem.src] = True
    read = np.array([float(nd.bytes_read) - float(nd.param_bytes) for nd in problem.graph.nodes], dtype=np.float64)
    return np.maximum(read - in_edge, 0.0), has_succ


def caller_io_s(problem: Problem, seconds_per_byte: float) -> float:
    """Seconds the Ray executor's caller spends on the bytes of its hops, beyond the hop
    itself (its dispatch): each input written to the actor that reads it and each result read
    back from the actor that made it, at ``seconds_per_byte``
    (:func:`tvm_pesto.cluster.dispatch.dispatch_info`'s ``caller_s_per_byte``).

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("a", "relax.add", bytes_read=4096, bytes_written=1024)], [])
    >>> p = Problem(g, parse_cluster("cpu:2"), np.ones((1, 2)))
    >>> round(caller_io_s(p, 1e-9) * 1e6, 3)   # 4 KiB in, 1 KiB out at a nanosecond a byte
    5.12
    """
    if not problem.num_nodes:
        return 0.0
    external, has_succ = _external_io(problem)
    results = sum(float(nd.output_bytes) for nd, s in zip(problem.graph.nodes, has_succ) if not s)
    return float(seconds_per_byte) * (float(external.sum()) + results)


def switch_points(plan: Plan, num_nodes: int, backends=None) -> np.ndarray:
    """Per plan node, whether it switches library: its backend (its unit's, else
    ``backends[node]``: a contracted problem's, :attr:`Problem.backends`) is not the backend
    of the node before it in its device's order (False for every node where neither says,
    or where they do not match the nodes)."""
    out = np.zeros(num_nodes, dtype=bool)
    units = plan.units
    if units and len(units) == num_nodes:
        backends = [u.backend for u in units]
    if not backends or len(backends) != num_nodes:
        return out
    for seq in plan.order:
        for prev, v in zip(seq, seq[1:]):
            out[v] = backends[v] != backends[prev]
    return out


def switch_charges(problem: Problem, plan: Plan) -> np.ndarray:
    """Per plan node, the seconds a switch between libraries adds to it: on each device, a
    unit whose backend is not the backend of the unit before it in the device's order pays
    the device's switch figure (:func:`tvm_pesto.cluster.dispatch.switch_figures`) once; the
    first unit of a device pays nothing, nor does every node of a plan whose backends are
    unknown (no ``plan.units`` and no :attr:`Problem.backends`: a graph that is not a module).

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> from tvm_pesto.cluster.dispatch import set_switch
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> from tvm_pesto.candidates import Candidate
    >>> g = OpGraph([OpNode(k, "relax.add") for k in "abcd"], [])
    >>> p = Problem(g, parse_cluster("cpu:2"), np.ones((4, 2)))
    >>> _ = set_switch(p.cluster, {1: 1e-5}, "measured")
    >>> units = [Candidate(b, (k,)) for k, b in enumerate(["tvm", "onnxruntime", "onnxruntime", "tvm"])]
    >>> plan = Plan(np.array([0, 0, 0, 0]), [[0, 1, 2, 3], []], units=units)
    >>> switch_charges(p, plan).tolist()      # tvm -> ort (b pays), ort -> ort (c does not), ort -> tvm (d pays)
    [0.0, 1e-05, 0.0, 1e-05]
    """
    return _charged(problem, plan, switch_points(plan, problem.num_nodes, problem.backends))


def _charged(problem: Problem, plan: Plan, points: np.ndarray) -> np.ndarray:
    """:func:`switch_charges` of the switches at ``points`` (:func:`switch_points`)."""
    if not points.any():
        return np.zeros(problem.num_nodes)
    per_device = np.array([f.seconds for f in switch_figures(problem.cluster)])
    return np.where(points, per_device[plan.assignment], 0.0)


#: Fixed-point rounds of the contention model: each re-simulates with the slowdowns the
#: previous round's schedule implies.
CONTENTION_ROUNDS = 3


def _busy_until(starts: np.ndarray, finishes: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Seconds of work a serial device has done by each time in ``t`` (its intervals sorted)."""
    dur = finishes - starts
    done = np.concatenate([[0.0], np.cumsum(dur)])
    k = np.searchsorted(starts, t, side="right") - 1
    inside = np.where(k >= 0, np.clip(t - starts[np.maximum(k, 0)], 0.0, dur[np.maximum(k, 0)]), 0.0)
    return done[np.maximum(k, 0)] * (k >= 0) + inside


def memory_bound(problem: Problem, assignment: np.ndarray) -> np.ndarray:
    """True where a node is memory-bound on its device (FLOPs per byte below the device's
    ridge point ``peak_flops / mem_bandwidth``)."""
    devs = problem.cluster.devices
    ridge = np.array([dv.peak_flops / dv.mem_bandwidth for dv in devs])[assignment]
    flops = np.array([nd.flops for nd in problem.graph.nodes], dtype=np.float64)
    nbytes = np.array([nd.bytes_read + nd.bytes_written for nd in problem.graph.nodes], dtype=np.float64)
    return flops < ridge * np.maximum(nbytes, 1.0)


def contention_slowdown(problem: Problem, assignment: np.ndarray, start: np.ndarray, finish: np.ndarray,
                        factors: dict) -> np.ndarray:
    """Per node, ``1 + (s - 1) * f``: ``s`` the measured slowdown of its kind
    (:func:`tvm_pesto.cluster.contention.contention_factors`), ``f`` the share of its run
    during which the other devices of its host compute (averaged over them)."""
    n = len(assignment)
    hosts = problem.hosts
    used = np.unique(assignment)
    per_dev = {}
    for d in used:
        ids = np.flatnonzero(assignment == d)
        ids = ids[np.argsort(start[ids], kind="stable")]
        per_dev[int(d)] = (start[ids], finish[ids])
    overlap = np.zeros(n)
    n_other = np.zeros(n)
    for d in used:
        mine = assignment == d
        for e in used:
            if e == d or hosts[e] != hosts[d]:
                continue
            s_e, f_e = per_dev[int(e)]
            overlap[mine] += _busy_until(s_e, f_e, finish[mine]) - _busy_until(s_e, f_e, start[mine])
            n_other[mine] += 1
    dur = finish - start
    frac = np.where((n_other > 0) & (dur > 0), overlap / np.maximum(n_other, 1) / np.where(dur > 0, dur, 1.0), 0.0)
    s = np.where(memory_bound(problem, assignment), factors["memory"], factors["compute"])
    return 1.0 + (s - 1.0) * np.clip(frac, 0.0, 1.0)


def simulate(problem: Problem, plan: Plan, check_memory: bool = True, switches: bool = True) -> SimResult:
    """Simulate ``plan`` for ``problem``.

    When the cluster carries measured contention (``tvm-pesto cluster bench``,
    :mod:`tvm_pesto.cluster.contention`) and the plan uses two devices of one host, each
    node is slowed for the share of its run during which the host's other devices compute
    (:func:`contention_slowdown`), to a fixed point of :data:`CONTENTION_ROUNDS` rounds;
    ``SimResult.slowdown`` holds the factors. ``SimResult.dispatch_s`` is the executor's
    dispatch per run for the number of devices the plan uses
    (:func:`tvm_pesto.cluster.dispatch.dispatch_s`: the figures of the executor the cluster's
    figures are for, fitted on this machine or assumed), ``SimResult.io_s`` the home device's
    input and result transfers (:func:`home_io_s`; under the Ray executor, whose caller talks
    to every device's actor directly, the bytes of those hops at the fitted rate,
    :func:`caller_io_s`);
    ``run_s`` = makespan + io + dispatch. A unit that follows another backend's unit on its
    device takes the device's switch figure longer (:func:`switch_charges`): the schedule,
    and so the makespan, holds every switch; ``SimResult.switches`` and ``switch_s`` say
    how many and how much. Every plan of a cover's problem (:attr:`Problem.backends`) is
    charged, so the joint search and the comparisons between the solvers' plans weigh the
    switches; the ILPs do not model them, and their bounds are of the makespan without them
    (``switches=False``), which the charged makespan never undercuts.

    Raises
    ------
    PlanError
        If the plan is malformed or deadlocks.
    InfeasibleError
        If ``check_memory`` and a device's memory use exceeds its capacity.
    """
    n, d = problem.num_nodes, problem.num_devices
    plan.validate(n, d)
    cost = problem.costs[np.arange(n), plan.assignment] if n else np.zeros(0)
    if n and not np.isfinite(cost).all():
        bad = int(np.flatnonzero(~np.isfinite(cost))[0])
        raise InfeasibleError(f"the plan puts node {bad} ({problem.graph.nodes[bad].name}) on device "
                              f"{plan.assignment[bad]}, where it cannot run")
    core = _core()
    points = switch_points(plan, n, problem.backends) if switches else np.zeros(n, dtype=bool)
    switch, n_switches = _charged(problem, plan, points), int(points.sum())

    def run(node_cost):
        global _warned
        g = SimArrays(n, problem.src, problem.dst, problem.ebytes, problem.latency, problem.inv_bw, d, problem.mem,
                      problem.hosts)
        args = (g, plan.assignment, plan.order, node_cost)
        if core is not None:
            return core.simulate(*args)
        if not _warned:
            warnings.warn("tvm_pesto._core is not built; using the slow Python reference simulator "
                          "(run `pip install .` to build it)", RuntimeWarning, stacklevel=2)
            _warned = True
        return simulate_reference(*args)

    start, finish, busy, peak, transfers = run(cost + switch)
    slowdown = None
    factors = contention_factors(problem.cluster)
    used = np.unique(plan.assignment) if n else np.zeros(0, dtype=int)
    if max(factors.values()) > 1.0 and len(used) > 1 and len(np.unique(problem.hosts[used])) < len(used):
        for _ in range(CONTENTION_ROUNDS):
            slowdown = contention_slowdown(problem, plan.assignment, start, finish, factors)
            start, finish, busy, peak, transfers = run(cost * slowdown + switch)
    makespan = float(finish.max()) if n else 0.0
    disp = dispatch_info(problem.cluster)
    if disp["executor"] == "ray":
        # the caller sends each input to the actor that reads it and reads each result from the
        # actor that made it: no home-device copy; the hops are the Ray dispatch, their bytes io
        io, devices = caller_io_s(problem, disp["caller_s_per_byte"]), len(used)
    else:
        io = home_io_s(problem, plan.assignment, finish, makespan)
        # a program with any node away from home copies values between devices: the executor runs
        # it on worker threads (the multi-device dispatch), as it does a program on several devices
        away = bool(n) and bool((plan.assignment != HOME_DEVICE).any())
        devices = 2 if away else len(used)
    res = SimResult(start, finish, makespan, busy, peak, transfers, slowdown, dispatch_s(problem.cluster, devices),
                    io, n_switches, float(switch.sum()))
    if check_memory:
        over = np.flatnonzero(peak > problem.capacity * (1 + 1e-9))
        if len(over):
            k = int(over[0])
            raise InfeasibleError(
                f"plan by {plan.solver} needs {peak[k] / 2**20:.1f} MiB on device {k} "
                f"({problem.cluster.devices[k].name}), which holds {problem.capacity[k] / 2**20:.1f} MiB")
    return res
