"""Pure-Python discrete-event simulator: the specification the C++ core must match.

Semantics (shared with ``src/simulator.cc``):

* Each device runs the nodes of its order one at a time, in that order.
* A node starts when its device is free and every input is on its device. An input from
  the same device is there when its producer finishes. An input from another device
  arrives by a transfer on the directed link (producer device -> consumer device).
* One transfer per (producer, destination device), of the largest edge size from that
  producer to that device, queued when the producer finishes. A directed link carries one
  transfer at a time, first come first served (ties broken by producer id, then device).
  A transfer takes ``latency + bytes / bandwidth``.
* Hosts (``hosts[d]``: the host of device ``d``; default one host). A transfer between
  devices of two hosts goes through both hosts' network interfaces instead of a private
  link: it starts when the sending host's outgoing NIC and the receiving host's incoming
  NIC are both free, and holds both until it ends. So transfers leaving one host, to any
  device of any other host, run one at a time (and so do transfers entering one host).
* Memory is static: a device holds the weights and outputs of its nodes and every tensor it
  received, from the moment each appears until the end. The peak is the final total.
* If devices still have work but nothing can start and no transfer is in flight, the plan
  deadlocks (its orders contradict the graph) and :class:`PlanError` names the blocked nodes.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..errors import PlanError


@dataclass(frozen=True)
class SimArrays:
    """The graph and the links of a placement problem as the simulators read them
    (:func:`simulate_reference`, :func:`tvm_pesto._core.simulate`,
    :func:`tvm_pesto._core.list_schedule`).

    Attributes
    ----------
    n : int
        Number of nodes.
    src, dst : array of int, shape (m,)
        Edge endpoints.
    ebytes : array of float, shape (m,)
        Bytes each edge carries.
    latency, inv_bw : array of float, shape (d, d)
        Link latency (s) and inverse bandwidth (s/byte).
    num_devices : int
    mem : array of float, shape (n,), optional
        Resident bytes of each node (weights + outputs); the simulators need it, list
        scheduling does not.
    hosts : array of int, shape (d,), optional
        The host of each device (default: all on host 0). A transfer between two hosts
        holds the sending host's outgoing and the receiving host's incoming network
        interface, so such transfers share each host's NIC.
    """

    n: int
    src: np.ndarray
    dst: np.ndarray
    ebytes: np.ndarray
    latency: np.ndarray
    inv_bw: np.ndarray
    num_devices: int
    mem: np.ndarray | None = None
    hosts: np.ndarray | None = None


def _sends(src, dst, ebytes, assignment) -> tuple[dict, dict]:
    """The transfers a placement needs: ``need`` maps (producer, destination device) to the
    bytes of its largest edge there, ``dests`` each producer to its destination devices in
    increasing order."""
    need: dict[tuple[int, int], float] = {}
    for u, v, b in zip(src.tolist(), dst.tolist(), ebytes.tolist()):
        du, dv = int(assignment[u]), int(assignment[v])
        if du != dv:
            need[(u, dv)] = max(need.get((u, dv), 0.0), b)
    dests: dict[int, list[int]] = {}
    for (u, dv) in sorted(need):
        dests.setdefault(u, []).append(dv)
    return need, dests


def simulate_reference(g: SimArrays, assignment, order, cost):
    """Returns (start, finish, busy, peak_mem, transfers) of ``assignment`` and ``order`` on
    ``g``, each node taking ``cost`` on its device, with transfers as rows
    ``(producer, src_dev, dst_dev, start, end, bytes)``."""
    n, src, dst, ebytes, latency, inv_bw, mem, num_devices, hosts = (g.n, g.src, g.dst, g.ebytes, g.latency,
                                                                     g.inv_bw, g.mem, g.num_devices, g.hosts)
    host = [0] * num_devices if hosts is None else [int(h) for h in hosts]
    nic_out = {h: 0.0 for h in host}  # when each host's NIC is next free, per direction
    nic_in = {h: 0.0 for h in host}
    preds = [[] for _ in range(n)]
    for u, v in zip(src.tolist(), dst.tolist()):
        preds[v].append(u)
    need, dests = _sends(src, dst, ebytes, assignment)
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    arrive: dict[tuple[int, int], float] = {}
    link_free = np.zeros((num_devices, num_devices))
    dev_free = np.zeros(num_devices)
    pos = [0] * num_devices
    busy = np.zeros(num_devices)
    peak = np.zeros(num_devices)
    for v in range(n):
        peak[assignment[v]] += mem[v]
    transfers = []

    def ready_time(v):
        d = int(assignment[v])
        t = dev_free[d]
        for u in preds[v]:
            if int(assignment[u]) == d:
                if np.isnan(finish[u]):
                    return None
                t = max(t, finish[u])
            else:
                a = arrive.get((u, d))
                if a is None:
                    return None
                t = max(t, a)
        return t

    # Events: (time, kind, id). kind 0 = node finish. Transfers are queued on finish.
    events: list = []
    pending_tx: list = []  # (ready, producer, dst_dev)
    done = 0

    def try_start():
        started = True
        while started:
            started = False
            for d in range(num_devices):
                if pos[d] >= len(order[d]):
                    continue
                v = order[d][pos[d]]
                if not np.isnan(start[v]):
                    continue
                t = ready_time(v)
                if t is None:
                    continue
                start[v] = t
                finish[v] = t + cost[v]
                dev_free[d] = finish[v]
                busy[d] += cost[v]
                heapq.heappush(events, (finish[v], 0, v))
                started = True

    try_start()
    while events:
        t, _, v = heapq.heappop(events)
        pos[int(assignment[v])] += 1
        done += 1
        for dv in dests.get(v, []):
            pending_tx.append((t, v, dv))
        pending_tx.sort()
        for ready, u, dv in pending_tx:
            du = int(assignment[u])
            b = need[(u, dv)]
            hu, hv = host[du], host[dv]
            if hu == hv:
                s = max(ready, link_free[du, dv])
            else:
                s = max(ready, nic_out[hu], nic_in[hv])
            e = s + latency[du, dv] + b * inv_bw[du, dv]
            if hu == hv:
                link_free[du, dv] = e
            else:
                nic_out[hu] = e
                nic_in[hv] = e
            arrive[(u, dv)] = e
            peak[dv] += b
            transfers.append((u, du, dv, s, e, b))
        pending_tx.clear()
        try_start()
        # Arrivals may unblock nodes whose start was computed lazily; starting is idempotent.
    if done != n:
        blocked = [order[d][pos[d]] for d in range(num_devices) if pos[d] < len(order[d])]
        raise PlanError(f"the plan deadlocks: devices wait forever at nodes {blocked}; "
                        "each device's order must agree with the graph's dependencies")
    return start, finish, busy, peak, np.array(transfers, dtype=np.float64).reshape(-1, 6)
