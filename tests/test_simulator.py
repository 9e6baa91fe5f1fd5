"""The C++ simulator (tvm_pesto._core) against the Python reference and the model's invariants."""
from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tvm_pesto import _core
from tvm_pesto.errors import CycleError, PlanError
from tvm_pesto.plan.reference import SimArrays, simulate_reference

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _values(draw, size, small, hi):
    """Floats that often tie (drawn from ``small``) and sometimes are arbitrary."""
    elem = st.one_of(st.sampled_from(small), st.floats(0.0, hi, allow_nan=False, allow_infinity=False))
    return np.array(draw(st.lists(elem, min_size=size, max_size=size)), dtype=np.float64)


def _topo_order(n, src, dst, keys):
    """Kahn's algorithm taking the ready node with the smallest key first."""
    indeg = np.zeros(n, dtype=int)
    succ = [[] for _ in range(n)]
    for u, v in zip(src.tolist(), dst.tolist()):
        succ[u].append(v)
        indeg[v] += 1
    heap = [(keys[v], v) for v in range(n) if indeg[v] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, u = heapq.heappop(heap)
        out.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (keys[v], v))
    return out


@st.composite
def instances(draw, orders="valid"):
    """A random DAG, cluster and plan; ``orders`` is "valid" (from a topological order) or
    "any" (each device's nodes in a random order, which may deadlock)."""
    n = draw(st.integers(1, 30))
    d = draw(st.integers(1, 4))
    perm = draw(st.permutations(range(n)))  # perm[i]: the node at topological position i
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    edges = [(perm[min(a, b)], perm[max(a, b)]) for a, b in pairs if a != b]
    src = np.array([e[0] for e in edges], dtype=np.int32)
    dst = np.array([e[1] for e in edges], dtype=np.int32)
    ebytes = _values(draw, len(edges), [0.0, 1.0, 4.0, 1e3], 1e6)
    cost = _values(draw, n, [0.0, 0.5, 1.0, 2.0], 10.0)
    mem = _values(draw, n, [0.0, 8.0, 1e3], 1e6)
    latency = _values(draw, d * d, [0.0, 0.25, 1.0], 1e-3).reshape(d, d)
    inv_bw = _values(draw, d * d, [0.0, 1e-3, 0.5], 1e-5).reshape(d, d)
    assignment = np.array(draw(st.lists(st.integers(0, d - 1), min_size=n, max_size=n)), dtype=np.int32)
    if orders == "valid":
        keys = draw(st.permutations(range(n)))
        topo = _topo_order(n, src, dst, keys)
        order = [[v for v in topo if assignment[v] == k] for k in range(d)]
    else:
        order = [draw(st.permutations([v for v in range(n) if assignment[v] == k])) for k in range(d)]
    # The host of each device: often one host (the classic model), often several (shared NICs).
    hosts = np.array(draw(st.lists(st.integers(0, draw(st.integers(0, 2))), min_size=d, max_size=d)), dtype=np.int32)
    return n, src, dst, ebytes, assignment, order, cost, latency, inv_bw, mem, d, hosts


def _static_peak(n, src, dst, ebytes, assignment, mem, d):
    """The memory formula solvers use (CONTEXT.md): resident bytes plus, per device, the
    largest edge from each remote producer that feeds it."""
    peak = np.zeros(d)
    for v in range(n):
        peak[assignment[v]] += mem[v]
    recv = {}
    for u, v, b in zip(src.tolist(), dst.tolist(), ebytes.tolist()):
        if assignment[u] != assignment[v]:
            key = (u, int(assignment[v]))
            recv[key] = max(recv.get(key, 0.0), b)
    for (_, k), b in recv.items():
        peak[k] += b
    return peak


def _args(n, src, dst, ebytes, assignment, order, cost, latency, inv_bw, mem, num_devices, hosts=None):
    """The simulators' arguments from the flat ones: the graph and links as one SimArrays."""
    return SimArrays(n, src, dst, ebytes, latency, inv_bw, num_devices, mem, hosts), assignment, order, cost


def _assert_same(got, want):
    for g, w, name in zip(got, want, ["start", "finish", "busy", "peak", "transfers"]):
        assert g.shape == w.shape, name
        np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.slow
@SETTINGS
@given(instances())
def test_core_equals_reference(inst):
    _assert_same(_core.simulate(*_args(*inst)), simulate_reference(*_args(*inst)))


@pytest.mark.slow
@SETTINGS
@given(instances(orders="any"))
def test_core_equals_reference_on_any_orders(inst):
    try:
        want = simulate_reference(*_args(*inst))
    except PlanError as err:
        with pytest.raises(PlanError) as got:
            _core.simulate(*_args(*inst))
        assert str(got.value) == str(err)
        return
    _assert_same(_core.simulate(*_args(*inst)), want)


@pytest.mark.slow
@SETTINGS
@given(instances())
def test_invariants(inst):
    n, src, dst, ebytes, assignment, order, cost, latency, inv_bw, mem, d, hosts = inst
    start, finish, busy, peak, tx = _core.simulate(*_args(*inst))
    eps = 1e-9
    np.testing.assert_array_equal(finish, start + cost)
    # One device runs one node at a time, in the plan's order.
    for k in range(d):
        seq = order[k]
        assert all(start[b] >= finish[a] for a, b in zip(seq, seq[1:]))
        assert busy[k] == pytest.approx(sum(cost[v] for v in seq))
    # One transfer per (producer, destination device), after the producer finishes.
    rows = {(int(r[0]), int(r[2])): r for r in tx}
    assert len(rows) == len(tx)
    for u, v in zip(src.tolist(), dst.tolist()):
        du, dv = assignment[u], assignment[v]
        if du == dv:
            assert start[v] >= finish[u]
            continue
        r = rows[(u, int(dv))]
        assert r[1] == du and r[3] >= finish[u]
        assert r[4] - r[3] == pytest.approx(latency[du, dv] + r[5] * inv_bw[du, dv], rel=eps, abs=eps)
        assert start[v] >= r[4]
    need = {(u, int(assignment[v])) for u, v in zip(src.tolist(), dst.tolist()) if assignment[u] != assignment[v]}
    assert set(rows) == need
    # One directed link carries one transfer at a time.
    for k in range(d):
        for j in range(d):
            on_link = sorted((r[3], r[4]) for r in tx if r[1] == k and r[2] == j)
            assert all(b[0] >= a[1] for a, b in zip(on_link, on_link[1:]))
    # Transfers between hosts share each host's NIC: one at a time leaving a host, one entering.
    between = [r for r in tx if hosts[int(r[1])] != hosts[int(r[2])]]
    for h in set(hosts.tolist()):
        for end in (1, 2):  # leaving h (by source device), entering h (by destination)
            on_nic = sorted((r[3], r[4]) for r in between if hosts[int(r[end])] == h)
            assert all(b[0] >= a[1] for a, b in zip(on_nic, on_nic[1:]))
    # Memory: the simulator's peak is the static formula, so a plan that fits never overflows.
    formula = _static_peak(n, src, dst, ebytes, assignment, mem, d)
    np.testing.assert_allclose(peak, formula, rtol=1e-12)
    capacity = formula * 1.0000001 + 1.0
    assert (peak <= capacity).all()


@pytest.mark.slow
@SETTINGS
@given(instances(), st.data())
def test_swapped_dependency_deadlocks(inst, data):
    n, src, dst, ebytes, assignment, order, cost, latency, inv_bw, mem, d, hosts = inst
    assume(len(src) > 0)
    # Put both ends of some edge u -> v on one device, then run v before u there.
    e = data.draw(st.integers(0, len(src) - 1))
    u, v = int(src[e]), int(dst[e])
    assignment = assignment.copy()
    assignment[v] = assignment[u]
    k = int(assignment[u])
    topo = _topo_order(n, src, dst, list(range(n)))
    order = [[w for w in topo if assignment[w] == j] for j in range(d)]
    seq = order[k]
    i, j = seq.index(u), seq.index(v)
    seq[i], seq[j] = seq[j], seq[i]
    args = (n, src, dst, ebytes, assignment, order, cost, latency, inv_bw, mem, d, hosts)
    with pytest.raises(PlanError, match="deadlocks") as got:
        _core.simulate(*_args(*args))
    with pytest.raises(PlanError) as want:
        simulate_reference(*_args(*args))
    assert str(got.value) == str(want.value)


def test_cross_device_deadlock_names_blocked_nodes():
    # 0 -> 1 -> 2 -> 3 with 0, 3 on device 0 (ordered 3, 0) and 1, 2 on device 1.
    src, dst = np.array([0, 1, 2]), np.array([1, 2, 3])
    args = (4, src, dst, np.ones(3), np.array([0, 1, 1, 0]), [[3, 0], [1, 2]], np.ones(4),
            np.zeros((2, 2)), np.zeros((2, 2)), np.zeros(4), 2)
    with pytest.raises(PlanError, match=r"at nodes \[3, 1\]"):
        _core.simulate(*_args(*args))


def test_hand_computed_schedule():
    # 0 (dev 0) feeds 1 and 2 on dev 1 (4 and 8 bytes: one 8-byte transfer) and 3 on dev 0.
    src, dst = np.array([0, 0, 0, 1]), np.array([1, 2, 3, 2])
    lat = np.array([[0.0, 1.0], [1.0, 0.0]])
    inv = np.array([[0.0, 0.5], [0.5, 0.0]])
    start, finish, busy, peak, tx = _core.simulate(*_args(
        4, src, dst, np.array([4.0, 8.0, 2.0, 1.0]), np.array([0, 1, 1, 0]), [[0, 3], [1, 2]],
        np.array([1.0, 2.0, 3.0, 4.0]), lat, inv, np.array([10.0, 20.0, 30.0, 40.0]), 2))
    # Transfer 0->dev1 runs 1 .. 1 + 1 + 8 * 0.5 = 6.
    assert tx.tolist() == [[0, 0, 1, 1.0, 6.0, 8.0]]
    assert start.tolist() == [0.0, 6.0, 8.0, 1.0]
    assert finish.tolist() == [1.0, 8.0, 11.0, 5.0]
    assert busy.tolist() == [5.0, 5.0]
    assert peak.tolist() == [50.0, 58.0]


def test_transfers_between_hosts_share_the_nic():
    # Node 0 on device 0 (host 0) feeds 1 on device 2 and 2 on device 3 (both host 1).
    # Inside one host each pair has its own link; between hosts they queue on host 0's NIC.
    src, dst = np.array([0, 0]), np.array([1, 2])
    args = (3, src, dst, np.array([8.0, 8.0]), np.array([0, 2, 3]), [[0], [], [1], [2]], np.ones(3),
            np.full((4, 4), 1.0), np.full((4, 4), 0.25), np.zeros(3), 4)
    one = _core.simulate(*_args(*args, hosts=[0, 0, 0, 0]))
    two = _core.simulate(*_args(*args, hosts=[0, 0, 1, 1]))
    assert one[4][:, 3:5].tolist() == [[1.0, 4.0], [1.0, 4.0]]  # parallel links: both 1 .. 1 + 1 + 2
    assert two[4][:, 3:5].tolist() == [[1.0, 4.0], [4.0, 7.0]]  # one NIC: the second waits
    assert two[1].tolist() == [1.0, 5.0, 8.0]
    for got, want in zip(two, simulate_reference(*_args(*args, hosts=[0, 0, 1, 1]))):
        np.testing.assert_array_equal(got, want)
    # Different receiving hosts still share the sender's outgoing NIC; two senders on two
    # hosts into one host share its incoming NIC.
    assert _core.simulate(*_args(*args, hosts=[0, 0, 1, 2]))[4][:, 3].tolist() == [1.0, 4.0]
    src, dst = np.array([0, 1]), np.array([2, 2])
    args = (3, src, dst, np.array([8.0, 8.0]), np.array([0, 1, 2]), [[0], [1], [2]], np.ones(3),
            np.full((3, 3), 1.0), np.full((3, 3), 0.25), np.zeros(3), 3)
    assert _core.simulate(*_args(*args, hosts=[0, 1, 2]))[4][:, 3:5].tolist() == [[1.0, 4.0], [4.0, 7.0]]
    assert _core.simulate(*_args(*args, hosts=[0, 1, 1]))[4][:, 3:5].tolist() == [[1.0, 4.0], [1.0, 4.0]]


def test_hosts_are_checked():
    args = (1, np.zeros(0), np.zeros(0), np.zeros(0), np.array([0]), [[0], []], np.ones(1), np.zeros((2, 2)),
            np.zeros((2, 2)), np.zeros(1), 2)
    with pytest.raises(PlanError, match="hosts names 3 devices"):
        _core.simulate(*_args(*args, hosts=[0, 0, 0]))
    with pytest.raises(PlanError, match="host -1"):
        _core.simulate(*_args(*args, hosts=[0, -1]))


def test_rejects_malformed_plans():
    src, dst = np.array([0]), np.array([1])
    base = dict(n=2, src=src, dst=dst, ebytes=np.ones(1), cost=np.ones(2), latency=np.zeros((2, 2)),
                inv_bw=np.zeros((2, 2)), mem=np.zeros(2), num_devices=2)
    with pytest.raises(PlanError, match="assigned to"):
        _core.simulate(*_args(assignment=np.array([0, 1]), order=[[0, 1], []], **base))
    with pytest.raises(PlanError, match="exactly one"):
        _core.simulate(*_args(assignment=np.array([0, 1]), order=[[0], []], **base))
    with pytest.raises(PlanError, match="twice"):
        _core.simulate(*_args(assignment=np.array([0, 0]), order=[[0, 0], []], **base))
    with pytest.raises(PlanError, match="outside"):
        _core.simulate(*_args(assignment=np.array([0, 2]), order=[[0], [1]], **base))


def test_empty_graph():
    start, finish, busy, peak, tx = _core.simulate(*_args(
        0, np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), [[], []], np.zeros(0),
        np.zeros((2, 2)), np.zeros((2, 2)), np.zeros(0), 2))
    assert start.shape == (0,) and tx.shape == (0, 6) and busy.tolist() == [0.0, 0.0]


def test_simulate_uses_the_core():
    import importlib

    simulate_mod = importlib.import_module("tvm_pesto.plan.simulate")
    assert simulate_mod._core() is _core


# -- list scheduling ----------------------------------------------------------------------
def _list_schedule_py(n, src, dst, ebytes, costs, latency, inv_bw, priority, assignment, d):
    """Straightforward Python version of _core.list_schedule's rule."""
    succ = [[] for _ in range(n)]
    indeg = [0] * n
    send = {}
    for u, v, b in zip(src.tolist(), dst.tolist(), ebytes.tolist()):
        succ[u].append(v)
        indeg[v] += 1
        if assignment[u] != assignment[v]:
            key = (u, int(assignment[v]))
            send[key] = max(send.get(key, 0.0), b)
    heap = [(priority[v], v) for v in range(n) if indeg[v] == 0]
    heapq.heapify(heap)
    ready, free = [0.0] * n, [0.0] * d
    start, finish = np.full(n, np.nan), np.full(n, np.nan)
    order = [[] for _ in range(d)]
    while heap:
        _, v = heapq.heappop(heap)
        k = int(assignment[v])
        start[v] = max(free[k], ready[v])
        finish[v] = start[v] + costs[v, k]
        free[k] = finish[v]
        order[k].append(v)
        for w in succ[v]:
            kw = int(assignment[w])
            t = finish[v] if kw == k else finish[v] + latency[k, kw] + send[(v, kw)] * inv_bw[k, kw]
            ready[w] = max(ready[w], t)
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, (priority[w], w))
    return order, start, finish


@pytest.mark.slow
@SETTINGS
@given(instances(), st.data())
def test_list_schedule(inst, data):
    n, src, dst, ebytes, assignment, _, cost, latency, inv_bw, mem, d, hosts = inst
    costs = np.repeat(cost[:, None], d, axis=1) * (1 + np.arange(d))
    priority = np.array(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), dtype=np.float64)
    got = _core.list_schedule(SimArrays(n, src, dst, ebytes, latency, inv_bw, d), costs, priority, assignment)
    want = _list_schedule_py(n, src, dst, ebytes, costs, latency, inv_bw, priority, assignment, d)
    assert got[0] == want[0]
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    # Its orders never deadlock, and link contention only delays.
    node_cost = costs[np.arange(n), assignment]
    start, finish, *_ = _core.simulate(*_args(n, src, dst, ebytes, assignment, got[0], node_cost,
                                       latency, inv_bw, mem, d, hosts))
    assert (start >= got[1] - 1e-9 * (1 + np.abs(got[1]))).all()


def test_list_schedule_rejects_cycles():
    with pytest.raises(CycleError):
        _core.list_schedule(SimArrays(2, np.array([0, 1]), np.array([1, 0]), np.ones(2), np.zeros((1, 1)),
                                      np.zeros((1, 1)), 1), np.ones((2, 1)), np.zeros(2), np.zeros(2))
