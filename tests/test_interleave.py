"""Timing against reference kernels (costs/measure/interleave.py): a machine that changes speed under
the timer leaves the ratio alone; the records say how they were timed."""
import json

import numpy as np
import pytest

from tvm_pesto.costs.measure.interleave import (
    ReferenceTimer,
    burst_seconds,
    reference_functions,
)


class _Result:
    def __init__(self, t):
        self.results = [t]


class ToggleVM:
    """A VM whose kernels take ``base[name]`` seconds per call in the fast state and
    ``slow`` times that in the slow one; the state flips every ``period`` seconds of the
    simulated clock, which every timed call advances."""

    def __init__(self, base: dict, slow: float = 1.25, period: float = 0.05):
        self.base, self.slow, self.period, self.clock = dict(base), slow, period, 0.0
        for name in reference_functions():
            n = int(name.rsplit("_", 1)[1])
            self.base.setdefault(name, (2e-9 * n if "exp" in name else 3e-9 * n ** 1.5) + 5e-7)

    def __getitem__(self, name):
        return lambda *args: None

    def _factor(self) -> float:
        return self.slow if int(self.clock / self.period) % 2 else 1.0

    def time_evaluator(self, name, dev, number=1, repeat=1, min_repeat_ms=0):
        def run(*args):
            n = number
            if min_repeat_ms:
                n = max(n, int(np.ceil(min_repeat_ms * 1e-3 / self.base[name])))
            t = self.base[name] * self._factor()
            self.clock += n * t
            return _Result(t)
        return run


def test_ratios_to_the_reference_remove_the_machines_speed_states(monkeypatch):
    """Every function comes out in the same units (its fast time x one factor: the state mix
    of the references' bursts), although the machine flips between states under the timer."""
    from tvm_pesto.costs.measure import interleave

    monkeypatch.setattr(interleave, "_HISTORY", {})
    monkeypatch.setattr(interleave, "_WARMED", set())
    monkeypatch.setattr(interleave, "WARM_S", 0.05)
    groups = {f"g{i}": t for i, t in enumerate(np.geomspace(1e-6, 3e-3, 12))}
    vm = ToggleVM(groups)
    timer = ReferenceTimer(vm, None, rounds=5, burst_s=burst_seconds(5), key="toggling")
    idx = {}
    back_to_back = {}
    for name in groups:
        t = vm.time_evaluator(name, None, number=1, repeat=1, min_repeat_ms=25)()
        back_to_back[name] = t.results[0]
        idx[name] = timer.time(name, [])
    res = timer.results()
    got = np.array([float(np.median(res[idx[n]])) / groups[n] for n in groups])
    assert np.all((got >= 1.0 - 1e-9) & (got <= 1.25 + 1e-9)), got
    assert got.max() / got.min() < 1.03, got  # one set of units, not a state per function
    # the same machine timed back to back: functions land in either state (the fake is honest)
    b2b = np.array([back_to_back[n] / groups[n] for n in groups])
    assert b2b.max() / b2b.min() > 1.2
    rec = timer.describe(idx["g3"])
    assert rec["method"] == "interleaved" and rec["reference"] in reference_functions() and len(rec["ratios"]) == 5
    assert float(np.median(res[idx["g3"]])) == pytest.approx(np.median(rec["ratios"]) * rec["reference_s"])


def test_each_function_is_paired_with_the_reference_nearest_in_time():
    vm = ToggleVM({}, slow=1.0)
    timer = ReferenceTimer(vm, None, rounds=3)
    for name in reference_functions():
        assert timer.nearest_reference(vm.base[name]) == name
    assert timer.nearest_reference(1e-12) == min(reference_functions(), key=vm.base.get)
    assert timer.nearest_reference(10.0) == max(reference_functions(), key=vm.base.get)


def test_burst_length_follows_min_repeat_ms_with_a_floor():
    assert burst_seconds(5) == pytest.approx(1e-3)
    assert burst_seconds(10) == pytest.approx(2e-3)
    assert burst_seconds(0) == pytest.approx(1e-3)


@pytest.mark.slow
def test_measured_groups_are_timed_against_a_reference(tmp_path):
    from tvm_pesto.api import analyze, as_cluster
    from tvm_pesto.costs.measure.timing import OVERHEAD_KEY, measure_groups
    from tvm_pesto.costs.store.cache import MeasureCache
    from tvm_pesto.zoo import load

    a = analyze(load("mlp_mixer", "small").mod)
    log = tmp_path / "m.jsonl"
    t = measure_groups(a.rg, a.groups[:6], as_cluster("cpu:2").devices[0], MeasureCache(log), repeat=3)
    assert np.all(np.isfinite(t)) and np.all(t > 0)
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    groups = [r for r in recs if r["key"] != OVERHEAD_KEY]
    assert groups
    for r in groups:
        assert r["timing"]["method"] == "interleaved"
        assert r["timing"]["reference"] in reference_functions()
        assert len(r["repeats"]) == 3 and r["median_s"] == pytest.approx(float(np.median(r["repeats"])))
        ratio_s = np.median(r["timing"]["ratios"]) * r["timing"]["reference_s"]
        assert r["median_s"] == pytest.approx(ratio_s, rel=1e-9)


def test_timers_with_one_device_key_share_the_references_history(monkeypatch):
    """A short batch timed entirely in the slow state still comes out in the units of the
    process (here: fast, as its earlier, longer batch on the device); without the key (or
    with another) it takes the units of its own state."""
    from tvm_pesto.costs.measure import interleave

    monkeypatch.setattr(interleave, "_HISTORY", {})  # this process's other timers left aside
    monkeypatch.setattr(interleave, "WARM_S", 0.0)
    groups = {"a": 2e-5, "b": 3e-4}
    fast = ToggleVM({f"f{i}": t for i, t in enumerate(np.geomspace(1e-6, 3e-3, 40))}, slow=1.0)
    first = interleave.ReferenceTimer(fast, None, key="dev-A")
    for name in fast.base:
        if name.startswith("f"):
            first.time(name, [])
    first.results()
    for key, want in (("dev-A", 1.0), (None, 1.3), ("dev-B", 1.3)):
        slow = ToggleVM(groups, slow=1.3, period=1e9)
        slow.clock = 1e9  # every call in the slow state
        timer = interleave.ReferenceTimer(slow, None, rounds=3, key=key)
        idx = {n: timer.time(n, []) for n in groups}
        res = timer.results()
        for n, i in idx.items():
            assert np.median(res[i]) / groups[n] == pytest.approx(want, rel=0.04), (key, n)


def test_the_first_timer_of_a_device_samples_the_references_first(monkeypatch):
    """The first batch of a process may sit in one slow state for all of its calls; the first
    timer of a device times the references alone for a while first, so its units are those of
    a mix of states."""
    from tvm_pesto.costs.measure import interleave

    monkeypatch.setattr(interleave, "_HISTORY", {})
    monkeypatch.setattr(interleave, "_WARMED", set())
    monkeypatch.setattr(interleave, "WARM_S", 0.05)
    groups = {"a": 2e-5, "b": 3e-4}
    for key, lo, hi in (("first", 1.0, 1.25), (None, 1.3, 1.3)):
        vm = ToggleVM(groups, slow=1.3, period=1e-3 if key else 1e9)
        if key is None:
            vm.clock = 1e9
        timer = interleave.ReferenceTimer(vm, None, rounds=3, key=key)
        vm.period, vm.clock = 1e9, 1e9  # from here on, every call in the slow state
        idx = {n: timer.time(n, []) for n in groups}
        res = timer.results()
        for n, i in idx.items():
            assert lo - 1e-9 <= np.median(res[i]) / groups[n] <= hi + 1e-9, (key, n)
