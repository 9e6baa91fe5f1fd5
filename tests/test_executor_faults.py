"""Faults in the executor: a segment that raises, a worker thread that dies, Ctrl-C in the
middle of a run, and closing. The placed module runs a Python global function as a segment
on device 1 (``R.call_dps_packed``) while device 0 waits on its output; what the function
does (compute, raise, block) is set per test."""
import _thread
import signal
import threading
import time

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_pesto.api import analyze
from tvm_pesto.builder.placed import PlacedModule
from tvm_pesto.builder.rewrite import apply_plan
from tvm_pesto.candidates import Candidate
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.errors import ExecutionError
from tvm_pesto.plan import Plan
from tvm_pesto.run.program import Program, Step
from tvm_pesto.run.thread.executor import Executor

SEGMENT = "pesto_test.fault_segment"
X = np.arange(16, dtype="float32").reshape(4, 4) - 8


class Behaviour:
    """What the segment on device 1 does; reset before each test."""

    def __init__(self):
        self.mode = "ok"  # ok | raise | block
        self.started = threading.Event()  # the segment began
        self.returned = threading.Event()  # the segment returned (or raised)
        self.release = threading.Event()  # a blocked segment goes on
        self.calls = 0


B = Behaviour()


def _segment(x, out):
    B.calls += 1
    B.started.set()
    try:
        if B.mode == "raise":
            time.sleep(0.3)  # device 0 is waiting on this output by now
            raise ValueError("boom on purpose\nsecond line of the message")
        if B.mode == "block":
            assert B.release.wait(20), "the test never released the segment"
        out.copyfrom(x.numpy() * 2)
    finally:
        B.returned.set()


def _want(x):
    return 2 * x + np.maximum(x, 0)


def _module(assignment, order):
    """main(x) = segment(x) + relu(x); units: 0 = the segment, 1 = relu, 2 = add."""
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.call_dps_packed(SEGMENT, [x], relax.TensorType((4, 4), "float32")))
            b = bb.emit(relax.op.nn.relu(x))
            c = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(c)
    an = analyze(bb.get())
    assert [an.rg.graph.nodes[v].op for v in range(3)] == [f"extern:{SEGMENT}", "relax.nn.relu", "relax.add"]
    cluster = parse_cluster("cpu:2")
    plan = Plan(assignment, order, "manual", units=[Candidate("tvm", (v,)) for v in range(3)])
    return PlacedModule(apply_plan(an.rg, plan, cluster), cluster, plan)


@pytest.fixture(scope="module")
def placed():
    tvm.register_global_func(SEGMENT, _segment, override=True)
    # The segment on device 1; relu, then add (which waits on the segment's output), on device 0.
    pm = _module([1, 0, 0], [[1, 2], [0]])
    yield pm
    pm.close()


@pytest.fixture
def pm(placed):
    global B
    B = Behaviour()
    yield placed
    B.release.set()
    placed.close()


def within(seconds, fn, *args):
    """Run ``fn`` in a thread; fail unless it ends within ``seconds``. Returns (result, error)."""
    box = {}

    def target():
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} still running after {seconds} s (hung)"
    return box.get("result"), box.get("error")


def pesto_threads(ex):
    return [t for t in threading.enumerate() if t in set(ex.workers.values())]


def test_the_module_runs_on_both_devices(pm):
    np.testing.assert_allclose(pm(X), _want(X))
    assert pm.program.calls()[1].device == 1 and B.calls == 1


def test_a_failing_segment_names_device_segment_and_error(pm):
    B.mode = "raise"
    ex = pm._exec()
    trace: list = []
    _, err = within(10, ex.run, pm._inputs([X]), trace)  # a hang guard: the error ends the run, not a timeout
    assert isinstance(err, ExecutionError), repr(err)
    msg = str(err)
    assert "device 1 (cpu1)" in msg and "dev1_seg0" in msg and "ValueError: boom on purpose" in msg, msg
    assert "second line" not in msg
    assert isinstance(err.__cause__, ValueError) and "boom on purpose" in str(err.__cause__)
    # Device 0 abandoned the run: it never ran the add with the missing value.
    assert [e.name for e in trace if e.kind == "compute"] == ["dev0_seg0"]


def test_after_a_failure_no_job_runs_and_the_next_run_works(pm):
    B.mode = "raise"
    ex = pm._exec()
    with pytest.raises(ExecutionError, match="device 1"):
        pm(X)
    assert ex.busy_devices() == []
    assert ex.broken is None and pm._executor is ex  # a failing segment does not break the executor
    B.mode = "ok"
    np.testing.assert_allclose(pm(X), _want(X))
    assert all(w.is_alive() for w in ex.workers.values())


def test_a_failure_on_the_calling_thread_is_explained():
    """All on device 0 and no copy: the executor runs the segments in the caller."""
    tvm.register_global_func(SEGMENT, _segment, override=True)
    B.mode = "raise"
    pm = _module([0, 0, 0], [[0, 1, 2], []])
    try:
        assert pm._exec().single
        with pytest.raises(ExecutionError, match=r"device 0 \(cpu0\) failed in segment dev0_seg0: ValueError"):
            pm(X)
        B.mode = "ok"
        np.testing.assert_allclose(pm(X), _want(X))
    finally:
        B.mode = "ok"
        pm.close()


def test_a_worker_that_exited_is_reported_not_hung_on(pm):
    ex = pm._exec()
    w = ex.workers[1]
    w.jobs.put(None)  # behind the executor's back: the thread of device 1 ends
    w.join(5)
    assert not w.is_alive()
    _, err = within(10, pm, X)
    assert isinstance(err, ExecutionError) and "device 1 (cpu1)" in str(err) and "gone" in str(err), repr(err)
    assert B.calls == 0
    assert ex.busy_devices() == [] and ex.broken is not None
    with pytest.raises(ExecutionError, match="cannot run"):
        ex.run(pm._inputs([X]))
    # The module dropped the broken executor: the next call starts new workers.
    assert pm._executor is None
    np.testing.assert_allclose(pm(X), _want(X))
    assert pm._executor is not ex


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_that_dies_while_the_caller_waits_is_reported(pm):
    ex = pm._exec()
    w = ex.workers[1]

    def crash():
        time.sleep(0.5)  # the run's job is queued behind this one, device 0 waits
        raise RuntimeError("simulated worker crash")

    w.jobs.put(crash)
    _, err = within(10, pm, X)  # a hang guard: the dead worker ends the wait, not a timeout
    assert isinstance(err, ExecutionError), repr(err)
    assert "device 1 (cpu1)" in str(err) and "RuntimeError: simulated worker crash" in str(err), str(err)
    assert not w.is_alive() and ex.busy_devices() == []


@pytest.fixture
def ctrl_c():
    """Python's own Ctrl-C handler while the test runs (what a user's process has): an
    earlier test or library that changed it would make ``interrupt_main`` do nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _interrupt_when_started(delay_release=0.3):
    """Ctrl-C in the main thread once the segment runs; release the segment a bit later
    (``delay_release=None``: the test releases it). ``t.interrupted`` says whether the
    interrupt was sent (the segment started in time)."""
    b = B

    def go():
        t.interrupted = b.started.wait(30)
        if t.interrupted:
            _thread.interrupt_main()
            if delay_release is None:
                return
            time.sleep(delay_release)
        b.release.set()

    t = threading.Thread(target=go, daemon=True)
    t.interrupted = None
    t.start()
    return t


def _no_interrupt(timer) -> str:
    timer.join(35)
    return (f"no KeyboardInterrupt: interrupt sent {timer.interrupted}, segment started {B.started.is_set()}, "
            f"SIGINT handler {signal.getsignal(signal.SIGINT)!r}")


def test_keyboard_interrupt_stops_the_run_cleanly(pm, ctrl_c):
    B.mode = "block"
    ex = pm._exec()
    timer = _interrupt_when_started()
    with pytest.raises(KeyboardInterrupt):
        pm(X)
        pytest.fail(_no_interrupt(timer))
    timer.join(10)
    assert B.returned.is_set()  # the running step finished before the interrupt propagated
    assert ex.busy_devices() == []
    assert ex.broken is None
    B.mode = "ok"
    np.testing.assert_allclose(pm(X), _want(X))  # a later run works
    threads = pesto_threads(ex)
    assert threads and all(t.name.startswith("pesto-") for t in threads)
    pm.close()
    assert pesto_threads(ex) == []


def test_keyboard_interrupt_during_a_step_longer_than_the_grace(pm, ctrl_c):
    B.mode = "block"
    ex = pm._exec()
    ex.abandon_timeout_s = 0.2
    timer = _interrupt_when_started(delay_release=None)  # the step goes on only when this test says
    with pytest.raises(KeyboardInterrupt):
        pm(X)
        pytest.fail(_no_interrupt(timer))
    # it did not wait for the step: the step is still blocked, device 1 still busy with it
    assert ex.busy_devices() == [1] and not B.returned.is_set()
    B.release.set()
    timer.join(10)
    B.mode = "ok"
    np.testing.assert_allclose(pm(X), _want(X))  # queued behind the abandoned run, then runs
    assert ex.busy_devices() == []


def test_close_joins_every_worker_thread(pm):
    pm(X)
    ex = pm._exec()
    assert len(pesto_threads(ex)) == 2
    assert {t.name for t in ex.workers.values()} == {"pesto-cpu0", "pesto-cpu1"}
    pm.close()
    assert pesto_threads(ex) == [] and ex.closed
    pm.close()  # twice is fine
    with pytest.raises(ExecutionError, match="closed"):
        ex.run(pm._inputs([X]))
    # A closed module called again starts new workers.
    np.testing.assert_allclose(pm(X), _want(X))
    assert pm._executor is not ex and len(pesto_threads(pm._executor)) == 2


def test_close_reports_a_step_that_does_not_end(pm):
    B.mode = "block"
    ex = pm._exec()
    box = {}
    runner = threading.Thread(target=lambda: box.setdefault("out", ex.run(pm._inputs([X]))), daemon=True)
    runner.start()
    assert B.started.wait(10)
    with pytest.raises(ExecutionError, match=r"device 1 \(cpu1\) still running a step"):
        ex.close(timeout=0.2)
    B.release.set()
    runner.join(10)
    np.testing.assert_allclose(box["out"].numpy(), _want(X))  # the run in progress still completed
    ex.close()  # already closed: nothing more to do, and the threads end once the step returns
    deadline = time.monotonic() + 10
    while pesto_threads(ex) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pesto_threads(ex) == []


def test_an_executor_can_be_made_and_closed_directly(placed):
    ex = Executor(placed.program, placed.vms, placed.cluster)
    np.testing.assert_allclose(ex.run(placed._inputs([X])).numpy(), _want(X))
    ex.close()
    assert pesto_threads(ex) == []


def test_two_devices_failing_at_once_report_the_first_and_name_the_other():
    """A hand-made program over plain Python callables (no compiler): both segments raise."""
    barrier = threading.Barrier(2)

    def fail(kind):
        def f(x):
            barrier.wait(5)
            raise kind("failed on purpose")
        return f

    program = Program(["in:x"], [Step("call", "v1:a", ["in:x"], device=0, func="f0"),
                                 Step("call", "v2:b", ["in:x"], device=1, func="f1")], ("v1:a", "v2:b"), 2)
    ex = Executor(program, {0: {"f0": fail(KeyError)}, 1: {"f1": fail(OSError)}}, parse_cluster("cpu:2"))
    try:
        _, err = within(10, ex.run, [np.zeros(2)])
        assert isinstance(err, ExecutionError), repr(err)
        msg = str(err)
        first = err.__cause__
        assert isinstance(first, (KeyError, OSError))
        other = "device 1 (cpu1) with OSError" if isinstance(first, KeyError) else "device 0 (cpu0) with KeyError"
        assert f"{type(first).__name__}: " in msg.split(";")[0] and f"also failed: {other}" in msg, msg
        assert ex.busy_devices() == []
    finally:
        ex.close()
    assert pesto_threads(ex) == []


def test_only_values_another_device_reads_are_waited_on():
    """A chain that crosses devices twice (d0 -> d1 -> d0) with steps that stay on their
    device between: the result is right on every run, and only the two hand-offs get an
    event per run (a worker runs its own steps in order)."""
    slow = threading.Event()

    def add(k, wait=False):
        def f(x):
            if wait:
                slow.wait(0.05)  # device 1 finishes late: device 0 must wait for it
            return x + k
        return f

    program = Program(["in:x"], [Step("call", "v1:a", ["in:x"], device=0, func="a"),
                                 Step("call", "v2:b", ["v1:a"], device=0, func="b"),
                                 Step("call", "v3:c", ["v2:b"], device=1, func="c"),
                                 Step("call", "v4:d", ["v3:c"], device=1, func="d"),
                                 Step("call", "v5:e", ["v4:d", "v1:a"], device=0, func="e")], "v5:e", 2)
    vms = {0: {"a": add(1), "b": add(2), "e": lambda y, a: y * 10 + a},
           1: {"c": add(3, wait=True), "d": add(4)}}
    ex = Executor(program, vms, parse_cluster("cpu:2"))
    try:
        assert ex.cross == ["v2:b", "v4:d"]
        for x in range(3):
            assert ex.run([x]) == (x + 10) * 10 + x + 1
    finally:
        ex.close()
