"""The user's constraints bound to one model and cluster: which nodes each one holds, and
the candidate set and cost table that honour them.

:func:`check_names` refuses unknown backends and devices before the model is read;
:func:`resolve` matches every pattern against the op graph and refuses a pattern that
matches nothing, two pins that disagree on a node, a pin of a forbidden backend and pinned
nodes that overflow a device's memory cap; :meth:`NodeConstraints.restrict` keeps the
candidates that break no constraint and refuses a node left with none (a pin to a backend
that lacks the op); :meth:`NodeConstraints.mask` prices a node pinned to a device infinite
everywhere else. Every refusal is a :class:`~tvm_pesto.errors.ConstraintError` naming the
constraint and the reason.

Examples
--------
>>> from tvm_pesto.cluster import as_cluster
>>> from tvm_pesto.graph import OpGraph, OpNode
>>> g = OpGraph([OpNode("lv:conv2d", "relax.nn.conv2d", extra={"var": "lv"}),
...              OpNode("lv1:relu", "relax.nn.relu", extra={"var": "lv1"})], [(0, 1, 4)])
>>> nc = resolve(Constraints.parse(pin=["conv2d=tvm@cpu1"]), g, as_cluster("cpu:2"))
>>> nc.backend, nc.device, nc.pinned(0)
({0: 'tvm'}, {0: 1}, 'relax.nn.conv2d matches --pin conv2d=tvm@cpu1')
>>> try:
...     resolve(Constraints.parse(pin=["*softmax*=tvm"]), g, as_cluster("cpu:2"))
... except ConstraintError as e:
...     print(str(e)[:70])
--pin *softmax*=tvm: the pattern '*softmax*' matches no node of the mo
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import numpy as np

from ..backends.registry import list_backends
from ..cluster import Cluster
from ..errors import ConstraintError
from .spec import ANY_BACKEND, Constraints, Pin


def node_names(node) -> tuple[str, ...]:
    """The names a pattern is matched against for one op-graph node: its Relax op
    (``relax.nn.conv2d``), the op without ``relax.`` (``nn.conv2d``) and its last part
    (``conv2d``), its binding's variable (``lv3``), the node's name (``lv3:conv2d``) and,
    where the importer kept one, the source model's name of the node (``extra["source"]``;
    TVM's ONNX and PyTorch importers keep none today)."""
    op = str(node.op)
    names = [op, op.removeprefix("relax."), op.rsplit(".", 1)[-1], str(node.extra.get("var", "")), str(node.name),
             str(node.extra.get("source", ""))]
    return tuple(dict.fromkeys(n for n in names if n))


def matching_nodes(pattern: str, graph) -> list[int]:
    """The op-graph nodes one of whose :func:`node_names` matches the glob ``pattern``."""
    return [v for v, nd in enumerate(graph.nodes) if any(fnmatchcase(n, pattern) for n in node_names(nd))]


def device_index(cluster: Cluster, device: str, what: str) -> int:
    """The index of ``device`` (a name or an index) in ``cluster``, or the error naming ``what``."""
    names = [d.name for d in cluster.devices]
    if device in names:
        return names.index(device)
    if device.isdigit() and int(device) < len(names):
        return int(device)
    raise ConstraintError(f"{what}: {cluster.name} has no device {device!r}; its devices are {', '.join(names)} "
                          f"(or their indices 0..{len(names) - 1})")


def check_names(constraints: Constraints, cluster: Cluster) -> None:
    """Refuse a constraint naming an unknown backend or a device ``cluster`` lacks (before
    the model is read)."""
    known = list_backends()
    for c in (*constraints.pins, *constraints.forbids):
        if c.backend != ANY_BACKEND and c.backend not in known:
            raise ConstraintError(f"{c.spelling()}: unknown backend {c.backend!r}; known backends: {', '.join(known)}"
                                  + (" (or * in a pin that fixes the device alone)" if isinstance(c, Pin) else ""))
        if isinstance(c, Pin) and c.device is not None:
            device_index(cluster, c.device, c.spelling())
    for m in constraints.memory:
        device_index(cluster, m.device, m.spelling())


@dataclass
class NodeConstraints:
    """:class:`~tvm_pesto.constraints.spec.Constraints` bound to one op graph and cluster.

    Attributes
    ----------
    constraints : Constraints
    cluster : Cluster
        The cluster asked for with every memory cap applied (a device keeps the smaller of its
        memory and its cap).
    backend, device : dict
        Node -> the backend / device index a pin fixes.
    forbidden : dict
        Node -> the backends forbidden there.
    pins : dict
        Node -> the pin that holds it (for reports).
    """

    constraints: Constraints
    cluster: Cluster
    graph: object
    backend: dict = field(default_factory=dict)
    device: dict = field(default_factory=dict)
    forbidden: dict = field(default_factory=dict)
    pins: dict = field(default_factory=dict)

    def pinned(self, v: int) -> str | None:
        """What pins node ``v``: its op and the pin's spelling, or None."""
        pin = self.pins.get(v)
        return None if pin is None else f"{self.graph.nodes[v].op} matches {pin.spelling()}"

    def allows(self, candidate) -> bool:
        """Whether ``candidate`` (``backend``, ``nodes``) breaks no pin or forbid: no node of it
        is forbidden its backend or pinned to another, and its pinned nodes share a device."""
        b = candidate.backend
        for v in candidate.nodes:
            if b in self.forbidden.get(v, ()) or self.backend.get(v, b) != b:
                return False
        return len({self.device[v] for v in candidate.nodes if v in self.device}) <= 1

    def restrict(self, candidate_set):
        """``candidate_set`` without the candidates :meth:`allows` refuses.

        Raises
        ------
        ConstraintError
            When a node is left with no candidate: the pin or forbid that did it, and why.
        """
        kept = candidate_set.subset(self.allows)
        covered = set().union(*(c.nodes for c in kept)) if len(kept) else set()
        for v in range(self.graph.num_nodes):
            if v not in covered:
                raise ConstraintError(self._uncovered(v, candidate_set))
        return kept

    def _uncovered(self, v: int, candidate_set) -> str:
        nd = self.graph.nodes[v]
        offered = sorted({c.backend for c in candidate_set if v in c.nodes})
        b = self.backend.get(v)
        if b is not None:
            why = candidate_set.unavailable.get(b)
            why = (f"{b} is unavailable ({why})" if why else f"{b} has no candidate for it" if b not in offered
                   else f"every {b} candidate holding it also holds a node pinned or forbidden otherwise")
            return (f"{self.pins[v].spelling()}: node {nd.name} ({nd.op}) cannot run in {b}: {why}; backends that "
                    f"can run it here: {', '.join(offered)}. Pin it to one of those, or leave it out of the pattern")
        forbids = [f.spelling() for f in self.constraints.forbids if v in matching_nodes(f.pattern, self.graph)]
        if not forbids and v in self.pins:  # a device pin: every unit holding the node holds one pinned elsewhere
            return (f"{self.pins[v].spelling()}: node {nd.name} ({nd.op}) has no candidate without a node pinned to "
                    "another device (its units, e.g. TVM's fusion groups, hold both); pin the whole unit to one device")
        return (f"{', '.join(forbids) or 'the constraints'}: node {nd.name} ({nd.op}) is left with no backend (it "
                f"could run in {', '.join(offered)}); forbid fewer backends for it")

    def mask(self, table: np.ndarray, candidates) -> np.ndarray:
        """``table`` (candidates x devices) with each candidate holding a node pinned to a
        device priced ``inf`` (cannot run) on every other device."""
        out = np.array(table, dtype=np.float64, copy=True)
        if not self.device:
            return out
        for i, c in enumerate(candidates):
            devs = {self.device[v] for v in c.nodes if v in self.device}
            if devs:
                d = devs.pop()
                keep = out[i, d]
                out[i, :] = np.inf
                out[i, d] = keep
        return out

    def restricting(self) -> list[str]:
        """The constraints that can leave a part of the model no acyclic cover: pins to a
        backend other than ``tvm`` (whose single ops cover anything) and forbids of ``tvm``."""
        return [c.spelling() for c in (*self.constraints.pins, *self.constraints.forbids)
                if (isinstance(c, Pin) and c.backend not in ("tvm", ANY_BACKEND))
                or (not isinstance(c, Pin) and c.backend == "tvm")] or self.constraints.spellings()


def _bind_pins(nc: NodeConstraints, graph, cluster: Cluster) -> None:
    for pin in nc.constraints.pins:
        nodes = _matched(pin, graph)
        dev = None if pin.device is None else device_index(cluster, pin.device, pin.spelling())
        for v in nodes:
            other = nc.pins.get(v)
            if other is not None and ((pin.backend != ANY_BACKEND and nc.backend.get(v, pin.backend) != pin.backend)
                                      or (dev is not None and nc.device.get(v, dev) != dev)):
                raise ConstraintError(f"{pin.spelling()} and {other.spelling()} both match node {graph.nodes[v].name} "
                                      f"({graph.nodes[v].op}) and disagree; narrow one pattern")
            nc.pins[v] = pin
            if pin.backend != ANY_BACKEND:
                nc.backend[v] = pin.backend
            if dev is not None:
                nc.device[v] = dev


def _matched(c, graph) -> list[int]:
    nodes = matching_nodes(c.pattern, graph)
    if not nodes:
        ops = sorted({nd.op for nd in graph.nodes})
        raise ConstraintError(f"{c.spelling()}: the pattern {c.pattern!r} matches no node of the model; a pattern is a "
                              "glob matched against op names (relax.nn.conv2d, nn.conv2d, conv2d), binding names (lv3) "
                              f"and node names (lv3:conv2d); this model's ops: {', '.join(ops[:12])}"
                              + (" ..." if len(ops) > 12 else ""))
    return nodes


def _capped(nc: NodeConstraints, cluster: Cluster) -> Cluster:
    """``cluster`` with each memory cap applied, after checking the nodes pinned there fit."""
    if not nc.constraints.memory:
        return cluster
    devices = list(cluster.devices)
    for cap in nc.constraints.memory:
        d = device_index(cluster, cap.device, cap.spelling())
        need = sum(nc.graph.nodes[v].memory_bytes for v, dv in nc.device.items() if dv == d)
        if need > cap.bytes:
            pins = sorted({nc.pins[v].spelling() for v, dv in nc.device.items() if dv == d})
            raise ConstraintError(f"{cap.spelling()}: the nodes pinned to {cluster.devices[d].name} ({', '.join(pins)}) "
                                  f"hold {need:,} bytes of weights and outputs, over the cap of {cap.bytes:,} bytes; "
                                  "raise the cap or pin fewer nodes there")
        devices[d] = dataclasses.replace(devices[d], memory_bytes=float(min(devices[d].memory_bytes, cap.bytes)))
    return Cluster(cluster.name, devices, cluster.latency.copy(), cluster.bandwidth.copy(), cluster.meta,
                   list(cluster.hosts))


def resolve(constraints: Constraints, graph, cluster: Cluster) -> NodeConstraints:
    """``constraints`` bound to ``graph`` (an :class:`~tvm_pesto.graph.opgraph.OpGraph`) and
    ``cluster``: see the module doc for what is refused.

    Raises
    ------
    ConstraintError
        Naming the constraint and the reason.
    """
    check_names(constraints, cluster)
    nc = NodeConstraints(constraints, cluster, graph)
    _bind_pins(nc, graph, cluster)
    for f in constraints.forbids:
        for v in _matched(f, graph):
            if nc.backend.get(v) == f.backend:
                raise ConstraintError(f"{f.spelling()} and {nc.pins[v].spelling()} both match node "
                                      f"{graph.nodes[v].name} ({graph.nodes[v].op}): it is pinned to the backend "
                                      "forbidden there; drop one of them")
            nc.forbidden[v] = nc.forbidden.get(v, frozenset()) | {f.backend}
    nc.cluster = _capped(nc, cluster)
    return nc


__all__ = ["NodeConstraints", "check_names", "device_index", "matching_nodes", "node_names", "resolve"]
