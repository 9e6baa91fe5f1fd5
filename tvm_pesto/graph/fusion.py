"""Group operators the way TVM's operator fusion would, so each group is one placement unit.

Rules (a subset of TVM's ``FuseOps``, chosen to be cycle-safe by construction):

* an elementwise or broadcast op joins its producer's group when that producer is the
  group's tail and has no other consumer (conv2d + bias add + relu becomes one group);
* an op whose inputs are all weights or constants (no graph input, no other op) (``reshape`` of a bias, ``permute_dims``
  of a weight) joins its consumer's group when it has exactly one consumer.

Every non-tail member of a group has all its consumers inside the group, so the only
edges leaving a group leave from its tail, and contracting groups cannot create a cycle.
"""
from __future__ import annotations

from .flops import op_category
from .opgraph import OpGraph


def fusion_groups(graph: OpGraph) -> list[list[int]]:
    """Partition the nodes of ``graph`` into fusion groups (lists of node ids, topo order).

    Examples
    --------
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("c", "relax.nn.conv2d"), OpNode("r", "relax.nn.relu")], [(0, 1, 4)])
    >>> fusion_groups(g)
    [[0, 1]]
    """
    dag = graph.dag
    group_of: dict[int, int] = {}
    groups: list[list[int]] = []
    const_only = []
    for v in graph.topo_order():
        preds = list(dag.predecessors(v))
        nd = graph.nodes[v]
        if not preds and dag.out_degree(v) == 1 and nd.inputs and nd.param_bytes >= nd.bytes_read:
            const_only.append(v)
            continue
        joined = False
        if op_category(graph.nodes[v].op) == "elementwise":
            for u in sorted(preds, key=lambda p: -dag[p][v]["bytes"]):
                if u in group_of and dag.out_degree(u) == 1 and groups[group_of[u]][-1] == u:
                    gid = group_of[u]
                    groups[gid].append(v)
                    group_of[v] = gid
                    joined = True
                    break
        if not joined:
            group_of[v] = len(groups)
            groups.append([v])
    for v in const_only:
        (w,) = list(dag.successors(v))
        if w in group_of:
            gid = group_of[w]
            groups[gid].insert(0, v)
            group_of[v] = gid
        else:
            group_of[v] = len(groups)
            groups.append([v])
    order = {v: k for k, v in enumerate(graph.topo_order())}
    out = [sorted(g, key=order.__getitem__) for g in groups]
    out.sort(key=lambda g: order[g[-1]])
    return out
