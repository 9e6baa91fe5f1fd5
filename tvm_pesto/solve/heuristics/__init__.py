"""List-scheduling placement heuristics, each ``solve(problem) -> Plan``.

``common`` (their shared machinery: graph arrays, memory state, upward rank), ``single``
(one device), ``heft``, ``mtopo``, ``metf``, ``msct``, and ``portfolio`` (every heuristic,
the best plan).
"""
