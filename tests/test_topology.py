"""Clusters of several hosts: placement cuts where the least traffic crosses between hosts,
and the simulator makes transfers between hosts share each host's network interface."""
import numpy as np
import pytest

from tvm_pesto.cluster import parse_cluster
from tvm_pesto.graph.opgraph import OpGraph, OpNode
from tvm_pesto.plan import Plan, Problem, simulate
from tvm_pesto.solve import solve

BIG, SMALL = 64 << 20, 4 << 10


def four_chains(k: int = 5):
    """Four chains A, B, C, D of ``k`` equal ops (5 ms each). A and B swap a 64 MiB tensor
    at every layer, and so do C and D; A sends C, and D sends B, one 4 KiB tensor. On two
    hosts of two devices the best cut puts A, B on one host and C, D on the other: only the
    two small tensors cross. Chains are numbered A, C, B, D, so that filling devices in
    order would pair A with C."""
    order = "ACBD"
    nid = {(ch, i): order.index(ch) * k + i for ch in order for i in range(k)}
    nodes = [OpNode(f"{ch}{i}", "op") for ch in order for i in range(k)]
    edges = [(nid[ch, i], nid[ch, i + 1], BIG) for ch in order for i in range(k - 1)]
    for a, b in (("A", "B"), ("C", "D")):
        for i in range(k - 1):
            edges += [(nid[a, i], nid[b, i + 1], BIG), (nid[b, i], nid[a, i + 1], BIG)]
    edges += [(nid["A", 1], nid["C", 2], SMALL), (nid["D", 1], nid["B", 2], SMALL)]
    return OpGraph(nodes, edges, name="four-chains"), nid


def _between_hosts(problem, sim):
    h = problem.cluster.host_ids
    return sum(r[5] for r in sim.transfers if h[int(r[1])] != h[int(r[2])])


def _chains_on(problem, nid, devices: dict) -> Plan:
    """Each chain on the device ``devices`` names, ops in layer order."""
    assignment = np.zeros(problem.num_nodes, dtype=np.int32)
    for (ch, _), v in nid.items():
        assignment[v] = devices[ch]
    layer = {v: i for (_, i), v in nid.items()}
    return Plan.from_assignment(assignment, [layer[v] for v in range(problem.num_nodes)], problem.num_devices)


@pytest.mark.slow
def test_two_host_placement_cuts_where_the_least_traffic_crosses():
    cluster = parse_cluster("2x2xA100-25g")
    g, nid = four_chains()
    problem = Problem(g, cluster, np.full((g.num_nodes, cluster.num_devices), 5e-3))
    plan = solve(problem, "ilp", deterministic=True)
    sim = simulate(problem, plan)
    # The known best cut: each pair of swapping chains shares a host, so only the two small
    # tensors cross between hosts, and the four chains run in parallel.
    assert _between_hosts(problem, sim) == 2 * SMALL
    host = cluster.host_ids[plan.assignment]
    assert len({int(host[nid[ch, 0]]) for ch in "AB"}) == 1 and len({int(host[nid[ch, 0]]) for ch in "CD"}) == 1
    assert host[nid["A", 0]] != host[nid["C", 0]]
    # The simulator says why: the other cut (A, C on host 0) sends the 64 MiB tensors over
    # the network and is more than twice as slow.
    wrong = simulate(problem, _chains_on(problem, nid, {"A": 0, "C": 1, "B": 2, "D": 3}))
    assert _between_hosts(problem, wrong) > 10 * BIG
    assert wrong.makespan > 2 * sim.makespan
    right = simulate(problem, _chains_on(problem, nid, {"A": 0, "B": 1, "C": 2, "D": 3}))
    assert right.makespan == sim.makespan


def test_transfers_leaving_a_host_share_its_nic():
    """The same plan on the same links: with the devices split over two hosts, the transfers
    from A and B to C and D queue on one NIC; with one host each pair has its own link."""
    two = parse_cluster("2x2xA100-25g")
    one = parse_cluster("2x2xA100-25g")
    for dev in one.devices:
        dev.host = 0
    one.hosts = one.hosts[:1]
    g, nid = four_chains()
    costs = np.full((g.num_nodes, 4), 5e-3)
    p2, p1 = Problem(g, two, costs), Problem(g, one, costs)
    assert np.array_equal(p1.latency, p2.latency) and np.array_equal(p1.inv_bw, p2.inv_bw)
    plan = _chains_on(p2, nid, {"A": 0, "C": 1, "B": 2, "D": 3})
    shared, private = simulate(p2, plan), simulate(p1, plan)
    assert shared.makespan > 1.5 * private.makespan
    h = two.host_ids
    out = sorted((r[3], r[4]) for r in shared.transfers if h[int(r[1])] == 0 and h[int(r[2])] == 1)
    assert len(out) > 2 and all(b[0] >= a[1] for a, b in zip(out, out[1:]))
