"""Programs with state (a training step's parameters kept on their devices): the program's
input devices and state pairs survive a bundle, and a result tuple that gathers values made
early and late on several devices does not block the workers."""
import threading

import numpy as np
import tvm

from tvm_pesto.cluster import parse_cluster
from tvm_pesto.run.program import Program, Step
from tvm_pesto.run.thread.executor import Executor


def _within(seconds, fn, *args):
    box = {}

    def work():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    th = threading.Thread(target=work, daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), f"the run did not finish within {seconds} s (the workers block each other)"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_result_of_early_and_late_values_from_two_devices_does_not_block():
    """Device 0 makes ``a``, device 1 ``b`` from it, device 0 ``c`` from ``b``, device 1
    ``d`` from ``c``. The result ``(a, d)`` run on device 0's thread right after ``a`` would
    wait there for ``d``, before that thread sends ``a`` on: both devices would wait forever."""
    cpu = [tvm.cpu(0), tvm.cpu(1)]
    add = lambda k: (lambda x: tvm.runtime.tensor(x.numpy() + k, device=x.device))  # noqa: E731
    steps = [Step("call", "v1:a", ["in:x"], device=0, func="f"),
             Step("copy", "v2:a_d1", ["v1:a"], device=1),
             Step("call", "v3:b", ["v2:a_d1"], device=1, func="g"),
             Step("copy", "v4:b_d0", ["v3:b"], device=0),
             Step("call", "v5:c", ["v4:b_d0"], device=0, func="h"),
             Step("copy", "v6:c_d1", ["v5:c"], device=1),
             Step("call", "v7:d", ["v6:c_d1"], device=1, func="k"),
             Step("tuple", "v8:out", ["v1:a", "v7:d"])]
    program = Program(["in:x"], steps, "v8:out", 2, [0], [(1, 0)])
    ex = Executor(program, {0: {"f": add(1), "h": add(100)}, 1: {"g": add(10), "k": add(1000)}},
                  parse_cluster("cpu:2"))
    try:
        a, d = _within(20, ex.run, [tvm.runtime.tensor(np.zeros(2, np.float32), device=cpu[0])])
        assert a.numpy().tolist() == [1, 1] and d.numpy().tolist() == [1111, 1111]
        assert d.device == cpu[1]  # state stays where it was made
    finally:
        ex.close()


def test_program_input_devices_and_state_round_trip():
    p = Program(["in:x", "in:w"], [Step("call", "v1:y", ["in:x", "in:w"], device=1, func="f")], ("v1:y", "v1:y"),
                2, [0, 1], [(1, 1)])
    q = Program.from_dict(p.to_dict())
    assert q.input_devices == [0, 1] and q.state == [(1, 1)]
    old = p.to_dict()
    del old["input_devices"], old["state"]  # a bundle written before programs had state
    r = Program.from_dict(old)
    assert r.input_devices == [0, 0] and r.state == []


def test_benchmark_times_at_least_its_runs_and_its_seconds():
    """``benchmark`` runs exactly ``repeat`` / ``warmup`` times without time floors, and more
    when the runs would not last ``min_seconds`` / ``warmup_seconds``."""
    import time

    from tvm_pesto.run.runtime import PlacedRuntime

    calls = []

    def slow(x):
        calls.append(1)
        time.sleep(0.002)
        return x

    program = Program(["in:x"], [Step("call", "v1:y", ["in:x"], device=0, func="f")], "v1:y", 1, [0], [])
    rt = PlacedRuntime(program, {0: {"f": slow}}, parse_cluster("cpu:1"))
    x = np.zeros(2, np.float32)
    try:
        exact = rt.benchmark(x, repeat=3, warmup=2, min_seconds=0, warmup_seconds=0)
        assert (exact["repeat"], exact["warmup"], len(calls)) == (3, 2, 5)
        assert exact["min_s"] >= 0.002 and exact["min_s"] <= exact["median_s"] <= exact["max_s"]
        t0 = time.perf_counter()
        floored = rt.benchmark(x, repeat=3, warmup=2, min_seconds=0.05, warmup_seconds=0.02)
        wall = time.perf_counter() - t0
        n, w = floored["repeat"], floored["warmup"]
        assert n * floored["max_s"] >= 0.05  # the timed runs lasted 50 ms at least ...
        assert n == 3 or (n - 1) * floored["min_s"] < 0.05  # ... and it stopped once they did
        assert w >= 2 and wall >= 0.05 + 0.02 and len(calls) == 5 + n + w  # 20 ms of warm-up runs before them
    finally:
        rt.close()
