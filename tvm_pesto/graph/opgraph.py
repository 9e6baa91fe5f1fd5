"""The operator graph every stage of tvm-pesto works on.

An :class:`OpGraph` is a DAG whose nodes are operator calls (or fused groups of them) and
whose edges are tensors, weighted by their size in bytes. Node ids are the integers
``0 .. n-1``; for graphs taken from Relax they follow program order, which is a valid
topological order.
"""
from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import networkx as nx
import numpy as np

from ..errors import CycleError, GraphError

_DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "uint32": 4, "uint64": 8,
}


def dtype_bytes(dtype: str) -> int:
    """Size in bytes of one element of ``dtype`` (``"float32"`` -> 4)."""
    try:
        return _DTYPE_BYTES[dtype]
    except KeyError:
        raise GraphError(f"unsupported dtype {dtype!r}; supported: {sorted(_DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class TensorSpec:
    """Static shape and dtype of one tensor."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * dtype_bytes(self.dtype)


def _smallest_first_order(dag: nx.DiGraph, n: int) -> list[int]:
    """Kahn's topological order of nodes ``0 .. n-1``, the smallest id first among the ready
    ones (networkx's ``lexicographical_topological_sort`` with its default key, without its
    generic overhead: a local search makes thousands of graphs); shorter than ``n`` where
    the graph has a cycle.

    Examples
    --------
    >>> g = nx.DiGraph([(2, 0), (1, 0)]); g.add_node(3)
    >>> _smallest_first_order(g, 4) == list(nx.lexicographical_topological_sort(g))
    True
    """
    indegree = [0] * n
    for v, d in dag.in_degree():
        indegree[v] = d
    ready = [v for v in range(n) if indegree[v] == 0]
    heapq.heapify(ready)
    succ, order = dag.succ, []
    while ready:
        v = heapq.heappop(ready)
        order.append(v)
        for c in succ[v]:
            indegree[c] -= 1
            if indegree[c] == 0:
                heapq.heappush(ready, c)
    return order


@dataclass
class OpNode:
    """One operator call, or a group of them (``members`` then lists the original node ids).

    ``flops`` counts multiply and add separately (a multiply-accumulate is 2 FLOPs).
    ``bytes_read`` includes weights; ``param_bytes`` is the part of it that is weights
    (constants or bound parameters), which must stay resident on the node's device.
    """

    name: str
    op: str
    attrs: dict = field(default_factory=dict)
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    flops: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    param_bytes: int = 0
    members: tuple[int, ...] = ()
    extra: dict = field(default_factory=dict)

    @functools.cached_property
    def output_bytes(self) -> int:
        """Bytes of its outputs (worked out once: a local search reads a merged node's
        thousands of times)."""
        return int(sum(t.nbytes for t in self.outputs)) if self.outputs else int(self.bytes_written)

    @functools.cached_property
    def memory_bytes(self) -> int:
        """Bytes the node keeps on its device: weights plus its outputs."""
        return int(self.param_bytes + self.output_bytes)


class OpGraph:
    """A DAG of :class:`OpNode` with byte-weighted edges.

    Parameters
    ----------
    nodes : sequence of OpNode
        Node ``i`` of the graph is ``nodes[i]``.
    edges : iterable of (src, dst, nbytes)
        One edge per producer/consumer pair; ``nbytes`` is what must move if the two ends
        sit on different devices. Repeated pairs are merged (their bytes are not added,
        the tensor moves once).
    name : str
        A label used in reports.

    Raises
    ------
    GraphError
        If an edge names an unknown node or has negative bytes.
    CycleError
        If the edges form a cycle; the message lists one.

    Examples
    --------
    >>> g = OpGraph([OpNode("a", "x"), OpNode("b", "y")], [(0, 1, 1024)])
    >>> g.num_nodes, g.edge_bytes(0, 1)
    (2, 1024)
    """

    def __init__(self, nodes: Sequence[OpNode], edges: Iterable[tuple[int, int, int]], name: str = "graph"):
        self.nodes: list[OpNode] = list(nodes)
        self.name = name
        n = len(self.nodes)
        dag = nx.DiGraph()
        dag.add_nodes_from(range(n))
        for src, dst, nbytes in edges:
            if not (0 <= src < n) or not (0 <= dst < n):
                bad = src if not (0 <= src < n) else dst
                raise GraphError(f"graph {name!r}: edge ({src} -> {dst}) names unknown node {bad}; "
                                 f"nodes are 0..{n - 1}")
            if src == dst:
                raise CycleError(f"graph {name!r}: node {src} ({self.nodes[src].name}) feeds itself")
            if nbytes < 0:
                raise GraphError(f"graph {name!r}: edge ({src} -> {dst}) has negative size {nbytes}")
            if dag.has_edge(src, dst):
                dag[src][dst]["bytes"] = max(dag[src][dst]["bytes"], int(nbytes))
            else:
                dag.add_edge(src, dst, bytes=int(nbytes))
        order = _smallest_first_order(dag, n)
        if len(order) < n:
            cycle = nx.find_cycle(dag)
            names = " -> ".join(self.nodes[u].name for u, _ in cycle) + f" -> {self.nodes[cycle[0][0]].name}"
            raise CycleError(f"graph {name!r} has a cycle ({names}); a placement needs a DAG")
        self.dag = dag
        self._topo: list[int] = order
        self._topo_pos: dict[int, int] | None = None
        self._contract_cache: tuple[np.ndarray, np.ndarray] | None = None

    # -- basic queries -------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_edges(self) -> int:
        return self.dag.number_of_edges()

    def edges(self) -> list[tuple[int, int, int]]:
        """All edges as ``(src, dst, nbytes)``, sorted."""
        return sorted((u, v, d["bytes"]) for u, v, d in self.dag.edges(data=True))

    def edge_bytes(self, src: int, dst: int) -> int:
        return self.dag[src][dst]["bytes"]

    def preds(self, i: int) -> list[int]:
        return sorted(self.dag.predecessors(i))

    def succs(self, i: int) -> list[int]:
        return sorted(self.dag.successors(i))

    def topo_order(self) -> list[int]:
        """A deterministic topological order (smallest id first among ready nodes,
        networkx's ``lexicographical_topological_sort``), worked out when the graph is made."""
        return list(self._topo)

    def topo_position(self) -> dict[int, int]:
        """Node id -> its place in :meth:`topo_order`, worked out once per graph (every
        candidate's merged node and description sorts its members by it); not to be changed."""
        if self._topo_pos is None:
            self._topo_pos = {v: i for i, v in enumerate(self.topo_order())}
        return self._topo_pos

    def depth_first_order(self) -> list[int]:
        """A depth-first topological order (:func:`depth_first_order`, smallest id first)."""
        return depth_first_order(self.dag)

    def edge_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Edges as three arrays ``(src int32, dst int32, bytes float64)``."""
        e = self.edges()
        if not e:
            return (np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float64))
        arr = np.asarray(e, dtype=np.float64)
        return arr[:, 0].astype(np.int32), arr[:, 1].astype(np.int32), arr[:, 2].copy()

    def memory_array(self) -> np.ndarray:
        """Per-node resident bytes (weights + outputs) as float64."""
        return np.array([nd.memory_bytes for nd in self.nodes], dtype=np.float64)

    def total_flops(self) -> float:
        return float(sum(nd.flops for nd in self.nodes))

    def contract(self, groups: Sequence[Sequence[int]], name: str | None = None,
                 merged: Sequence[OpNode] | None = None) -> "OpGraph":
        """Merge each group of nodes into one node.

        Every node must be in exactly one group, and contracting must leave a DAG.
        The merged node sums FLOPs, bytes and weights, and lists its ``members``
        (ids in this graph, in topological order). Edges inside a group disappear;
        parallel edges between two groups keep the largest tensor size per source node
        and add up across distinct source nodes. ``merged``: each group's node, made by
        :meth:`merged` (it depends on the group alone) once for many contractions.

        Raises
        ------
        GraphError
            If a node is in two groups, in none, or a group names an unknown node.
        CycleError
            If the contracted graph has a cycle.

        Examples
        --------
        >>> g = OpGraph([OpNode("a", "x"), OpNode("b", "y"), OpNode("c", "z")], [(0, 1, 8), (1, 2, 4)])
        >>> c = g.contract([[0, 1], [2]])
        >>> c.num_nodes, c.nodes[0].members, c.edges()
        (2, (0, 1), [(0, 1, 4)])
        >>> g.contract([[0, 1], [2]], merged=[g.merged([0, 1]), g.merged([2])]).nodes == c.nodes
        True
        """
        n = self.num_nodes
        k = len(groups)
        lens = np.fromiter((len(g) for g in groups), dtype=np.int64, count=k)
        flat = np.fromiter((int(v) for g in groups for v in g), dtype=np.int64, count=int(lens.sum()))
        gid = np.repeat(np.arange(k, dtype=np.int64), lens)
        bad = (flat < 0) | (flat >= n)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise GraphError(f"group {int(gid[i])} names unknown node {int(flat[i])}; nodes are 0..{n - 1}")
        _, first_idx = np.unique(flat, return_index=True)
        if len(first_idx) != len(flat):  # the first repeat, reported as a sequential scan would
            first_of = np.full(n, -1, dtype=np.int64)
            first_of[flat[first_idx]] = first_idx
            dup = np.flatnonzero(first_of[flat] != np.arange(len(flat)))
            i = int(dup[0])
            v = int(flat[i])
            raise GraphError(f"node {v} is in two groups ({int(gid[first_of[v]])} and {int(gid[i])})")
        owner = np.full(n, -1, dtype=np.int64)
        owner[flat] = gid
        if (owner < 0).any():
            missing = np.flatnonzero(owner < 0)[:5].tolist()
            raise GraphError(f"nodes {missing} are in no group; every node needs one")
        topo_pos, earr = self._contract_arrays()
        srt = np.lexsort((topo_pos, owner))  # by group, then topological position
        bounds = np.concatenate([[0], np.cumsum(lens)]).tolist()
        members_flat = srt.tolist()

        m = len(earr)
        esrc, edst, ebytes = earr[:, 0], earr[:, 1], earr[:, 2]
        osrc, odst = owner[esrc], owner[edst]
        inside = osrc == odst
        internal = np.zeros(k, dtype=np.int64)
        np.add.at(internal, osrc[inside], ebytes[inside])
        # a member's outputs leave the group when it feeds another group or nothing at all
        feeds_out = np.zeros(n, dtype=bool)
        feeds_out[esrc[~inside]] = True
        has_succ = np.zeros(n, dtype=bool)
        has_succ[esrc] = True
        exported = (feeds_out | ~has_succ).tolist()
        internal = internal.tolist()

        nodes = self.nodes
        new_nodes = list(merged) if merged is not None else [
            _merged_node([nodes[v] for v in members_flat[bounds[gi]:bounds[gi + 1]]],
                         members_flat[bounds[gi]:bounds[gi + 1]], internal[gi], exported) for gi in range(k)]

        # between groups: the largest tensor per (source node, destination group), summed over
        # source nodes per (source group, destination group); edges in order of first appearance
        cross = np.flatnonzero(~inside)
        edges: list[tuple[int, int, int]] = []
        if len(cross):
            key = esrc[cross] * k + odst[cross]
            ukey, inv = np.unique(key, return_inverse=True)
            big = np.zeros(len(ukey), dtype=np.int64)
            np.maximum.at(big, inv, ebytes[cross])
            first = np.full(len(ukey), m, dtype=np.int64)
            np.minimum.at(first, inv, cross)
            pair = owner[ukey // k] * k + ukey % k
            upair, pinv = np.unique(pair, return_inverse=True)
            total = np.zeros(len(upair), dtype=np.int64)
            np.add.at(total, pinv, big)
            pfirst = np.full(len(upair), m, dtype=np.int64)
            np.minimum.at(pfirst, pinv, first)
            order = np.argsort(pfirst, kind="stable")
            edges = list(zip((upair[order] // k).tolist(), (upair[order] % k).tolist(), total[order].tolist()))
        return OpGraph(new_nodes, edges, name=name or self.name)

    def _contract_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Each node's topological position, and the edges ``(src, dst, bytes)`` in networkx's
        iteration order: what every :meth:`contract` of this graph reads (a local search
        contracts one graph thousands of times), worked out once."""
        if self._contract_cache is None:
            n, m = self.num_nodes, self.dag.number_of_edges()
            topo_pos = np.empty(n, dtype=np.int64)
            topo_pos[self.topo_order()] = np.arange(n)
            earr = np.fromiter((x for e in self.dag.edges(data="bytes") for x in e), dtype=np.int64,
                               count=3 * m).reshape(m, 3)
            self._contract_cache = (topo_pos, earr)
        return self._contract_cache

    def merged(self, nodes: Sequence[int]) -> OpNode:
        """The node that :meth:`contract` would make of ``nodes`` (FLOPs, bytes, weights).

        Examples
        --------
        >>> g = OpGraph([OpNode("a", "x", bytes_read=8, bytes_written=8),
        ...              OpNode("b", "y", bytes_read=8, bytes_written=4)], [(0, 1, 8)])
        >>> m = g.merged([0, 1])
        >>> m.bytes_read, m.bytes_written, m.members
        (8, 4, (0, 1))
        """
        members = sorted({int(v) for v in nodes}, key=self.topo_position().__getitem__)
        inside = set(members)
        internal = 0
        exported = {}
        for v in members:
            succ = list(self.dag.successors(v))
            exported[v] = not succ or any(w not in inside for w in succ)
            internal += sum(self.dag[v][w]["bytes"] for w in succ if w in inside)
        return _merged_node([self.nodes[v] for v in members], members, internal, exported)

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, nodes={self.num_nodes}, edges={self.num_edges})"


def depth_first_order(dag: nx.DiGraph, key=None) -> list:
    """A depth-first topological order of ``dag`` (acyclic): the reverse postorder of a depth-first
    search from its sources, the node of least ``key`` (default: the node itself) taken first
    among the sources and among each node's successors, so each branch stays together.

    Examples
    --------
    Two branches, ``1 -> 3`` and ``2 -> 4``, joined at 5:

    >>> dag = nx.DiGraph([(0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 5)])
    >>> depth_first_order(dag)
    [0, 1, 3, 2, 4, 5]
    >>> list(nx.lexicographical_topological_sort(dag))   # the least ready id first: they interleave
    [0, 1, 2, 3, 4, 5]
    """
    key = key or (lambda v: v)
    root = object()  # a source above the sources: one search visits every node
    above = nx.DiGraph(dag)
    above.add_edges_from((root, v) for v, d in dag.in_degree() if d == 0)
    post = list(nx.dfs_postorder_nodes(above, root, sort_neighbors=lambda vs: sorted(vs, key=key, reverse=True)))
    if len(post) != len(above):
        raise CycleError("the graph has a cycle: no topological order")
    return post[-2::-1]


def _merged_node(ms: list[OpNode], members, internal_bytes: int, exported) -> OpNode:
    """One node for the group ``ms`` (ids ``members``, topological order): inputs read from
    outside (``internal_bytes`` of edges inside are not read), outputs that leave
    (``exported[v]``: feeds another group or nothing)."""
    members = tuple(int(v) for v in members)
    read = sum(m.bytes_read for m in ms) - internal_bytes
    last = ms[-1]
    outs = tuple(t for v, m in zip(members, ms) if exported[v] for t in m.outputs)
    return OpNode(
        name=ms[0].name if len(ms) == 1 else f"{ms[0].name}..{last.name}",
        op="+".join(m.op for m in ms),
        attrs=dict(ms[0].attrs) if len(ms) == 1 else {},
        inputs=ms[0].inputs,
        outputs=outs if outs else last.outputs,
        flops=float(sum(m.flops for m in ms)),
        bytes_read=int(max(read, 0)),
        bytes_written=int(sum(t.nbytes for t in outs)) if outs else last.bytes_written,
        param_bytes=int(sum(m.param_bytes for m in ms)),
        members=members,
        extra={"member_extra": [m.extra for m in ms]} if any(m.extra for m in ms) else {},
    )
