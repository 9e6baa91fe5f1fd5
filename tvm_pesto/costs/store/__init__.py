"""Where measurements are kept: the measurement cache (:mod:`.cache`, JSON lines keyed by
structural key, backend and target) and the JSON-lines files it, the build log and the
profiler logs are appended to by several processes at once (:mod:`.jsonl`).

Imports nothing else of :mod:`tvm_pesto.costs`.
"""
