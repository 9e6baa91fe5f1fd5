"""The pipeline executor: a stream of microbatches through a placed program gives the same
outputs as running them one by one, overlaps the devices, and reports failures."""
from __future__ import annotations

import json
import time
import warnings

import numpy as np
import pytest
import tvm
from click.testing import CliRunner

from tvm_pesto.cli.main import cli
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.errors import ExecutionError
from tvm_pesto.run.program import Program, Step
from tvm_pesto.run.runtime import PlacedRuntime
from tvm_pesto.run.thread.pipeline import microbatch_inputs, run_pipeline

warnings.filterwarnings("ignore", category=RuntimeWarning)


def segment(fn, sleep_s=0.0, fail_on=None):
    """A segment function on TVM tensors computing ``fn`` on numpy (``fail_on``: raise when
    the first input's first element equals it)."""
    def call(*args):
        xs = [a.numpy() for a in args]
        if fail_on is not None and np.isclose(xs[0].ravel()[0], fail_on):
            raise RuntimeError("boom")
        if sleep_s:
            time.sleep(sleep_s)
        out = fn(*xs)
        if isinstance(out, tuple):
            return tuple(tvm.runtime.tensor(o, device=args[0].device) for o in out)
        return tvm.runtime.tensor(out, device=args[0].device)
    return call


def two_stage_runtime(sleep_s=0.0, fail_on=None, first=None, second=None) -> PlacedRuntime:
    """device 0: a = first(x) = 2x+1, (p, q) = split(a); device 1: b = second(p, q) = tanh(p) * q;
    output (b, a)."""
    vms = {0: {"s0": segment(first or (lambda x: 2 * x + 1), sleep_s, fail_on),
               "s1": segment(lambda a: (a[: len(a) // 2], a[len(a) // 2:]))},
           1: {"s2": segment(second or (lambda p, q: np.tanh(p) * q), sleep_s)}}
    steps = [Step("call", "a", ["in:x"], 0, "s0"), Step("call", "pq", ["a"], 0, "s1"),
             Step("item", "p", ["pq"], 0, index=0), Step("item", "q", ["pq"], 0, index=1),
             Step("copy", "p@1", ["p"], 1), Step("copy", "q@1", ["q"], 1), Step("call", "b", ["p@1", "q@1"], 1, "s2"),
             Step("copy", "b@0", ["b"], 0), Step("alias", "out", ["b@0"], 0)]
    return PlacedRuntime(Program(["in:x"], steps, ("out", "a"), 2), vms, parse_cluster("cpu:2"))


def test_pipelined_outputs_equal_the_unpipelined_ones():
    rt = two_stage_runtime()
    batches = [[np.random.default_rng(m).standard_normal(8).astype("float32")] for m in range(5)]
    outs, facts = run_pipeline(rt, batches)
    assert facts["microbatches"] == 5 and facts["devices"] == [0, 1]
    for out, b in zip(outs, batches):
        ref = rt(*b)
        assert len(out) == 2
        for o, r in zip(out, ref):
            np.testing.assert_array_equal(o, r)
    assert not np.allclose(outs[0][0], outs[1][0])  # the microbatches differ, so a mix-up would show
    rt.close()


def test_the_stream_overlaps_the_devices():
    """Device 1's step of microbatch m waits until device 0 has started microbatch m + 1:
    a pipeline runs them side by side; one by one, the wait would end only at its hang guard."""
    import threading

    started = {}  # microbatch (the input's value) -> device 0 began it
    overlapped = []

    def first(x):
        started.setdefault(float(x[0]), threading.Event()).set()
        return 2 * x + 1

    def second(p, q):
        m = (float(p[0]) - 1) / 2  # the microbatch's value, back from a = 2x + 1
        if m < 6:  # the last one has no next microbatch to wait for
            overlapped.append(started.setdefault(m + 1, threading.Event()).wait(10))
        return np.tanh(p) * q

    rt = two_stage_runtime(first=first, second=second)
    batches = [[np.full(8, m + 1, dtype="float32")] for m in range(6)]
    outs, _ = run_pipeline(rt, batches)
    assert overlapped == [True] * 5, overlapped
    want = two_stage_runtime()
    for out, b in zip(outs, batches):
        np.testing.assert_array_equal(out[0], want(*b)[0])
    rt.close()
    want.close()


def test_a_failing_microbatch_names_device_step_and_microbatch():
    rt = two_stage_runtime(fail_on=3.0)
    batches = [[np.full(4, m, dtype="float32")] for m in range(5)]
    with pytest.raises(ExecutionError, match=r"device 0 \(cpu0\) failed in segment s0 on microbatch 3: RuntimeError"):
        run_pipeline(rt, batches)
    outs, _ = run_pipeline(rt, batches[:3])  # the module stays usable
    assert len(outs) == 3
    rt.close()


def test_microbatch_inputs_differ_but_keep_shapes_and_dtypes():
    ex = [np.ones((2, 3), dtype="float32"), np.arange(6, dtype="int64").reshape(2, 3)]
    bs = microbatch_inputs(ex, 3)
    assert [b[0].shape for b in bs] == [(2, 3)] * 3 and bs[2][1].dtype == np.int64
    np.testing.assert_array_equal(bs[0][0], ex[0])
    assert not np.array_equal(bs[1][0], bs[0][0]) and not np.array_equal(bs[1][1], bs[0][1])


@pytest.mark.slow
def test_run_throughput_streams_a_zoo_model_through_a_stage_plan(tmp_path):
    out = tmp_path / "run.json"
    res = CliRunner().invoke(cli, ["run", "mlp_mixer", "--size", "small", "--cluster", "cpu:2", "--objective",
                                   "throughput", "--microbatches", "4", "--costs", "roofline", "--repeat", "1",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["objective"] == "throughput" and data["model_used"] == "stage" and data["microbatches"] == 4
    assert data["stage_plan_valid"] and data["solver"] == "stage-dp"
    assert data["max_abs_err_pipelined_vs_one_by_one"] == 0.0 and data["max_abs_err_vs_unplaced"] <= 1e-4
    assert data["measured_time_per_sample_s"] > 0 and data["simulated_time_per_sample_s"] > 0
    assert "time per sample: measured" in " ".join(res.output.split())
