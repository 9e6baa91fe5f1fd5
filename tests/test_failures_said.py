"""Failures are said, not turned into silence: a backend whose checks raise is reported (not
dropped without a word), a heuristic that raises is named in the plan and warned about, a
thread that cannot be pinned to its device's cores is reported."""
import logging
import os
import threading
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from tvm_pesto import api
from tvm_pesto.backends import register_backend, unregister_backend
from tvm_pesto.backends.gpu import patterns
from tvm_pesto.backends.gpu.cublas import CublasBackend
from tvm_pesto.backends.torch_ops import TorchBackend
from tvm_pesto.bench.random_dag import dnn_like_problem
from tvm_pesto.candidates import checks, generate
from tvm_pesto.candidates.convex import Reach
from tvm_pesto.candidates.examples import tiny_mlp
from tvm_pesto.cluster import device_thread, parse_cluster
from tvm_pesto.errors import InfeasibleError, PestoError
from tvm_pesto.graph.relax_import import from_relax
from tvm_pesto.run.program import Program, Step
from tvm_pesto.run.thread.executor import Executor
from tvm_pesto.solve.heuristics import portfolio
from tvm_pesto.solve.placement_ilp.warm_solve import solve_ilp


@pytest.fixture
def rg():
    return from_relax(tiny_mlp()[0])


@pytest.fixture(autouse=True)
def fresh_records(monkeypatch):
    """Each test sees its own once-per-process warnings and pinning record."""
    monkeypatch.setattr(checks, "_WARNED", set())
    monkeypatch.setattr(device_thread, "_FAILURES", {})


class RaisingTorch(TorchBackend):
    """torch's patterns without their checks, so ``supports_op`` is the only predicate; it
    raises ``exc`` for the ops in ``ops`` (all: None)."""

    name = "torch-raising"

    def __init__(self, exc, ops=None):
        super().__init__()
        self.exc, self.ops = exc, ops

    def patterns(self):
        return [(name, pat, None) for name, pat, _ in super().patterns()]

    def supports_op(self, call):
        if self.ops is None or call.op.name in self.ops:
            raise self.exc
        return super().supports_op(call)


def _said(record, name):
    return [w for w in record if issubclass(w.category, RuntimeWarning) and repr(name) in str(w.message)]


# -- candidate generation ----------------------------------------------------------------------
def test_a_backend_whose_supports_op_raises_is_reported_not_dropped_silently(rg):
    good = TorchBackend()
    clean = generate.generate_candidates(rg, [good]).by_backend()["torch"]
    bad = RaisingTorch(RuntimeError("supports_op bug"))
    with pytest.warns(RuntimeWarning, match="'torch-raising'.*RuntimeError: supports_op bug"):
        cs = generate.generate_candidates(rg, [good, bad])
    assert "torch-raising" not in cs.by_backend()  # its candidates cannot be trusted
    assert cs.by_backend()["torch"] == clean  # the other backends keep theirs
    why = cs.unavailable["torch-raising"]
    rec = cs.check_errors["torch-raising"]
    assert rec["failed"] > 0 and rec["answered"] == 0
    assert f"raised {rec['failed']} time(s)" in why and "RuntimeError: supports_op bug" in why, why
    assert "RuntimeError: supports_op bug" in rec["first_failure"]
    assert cs.subset(lambda c: True).check_errors == cs.check_errors
    # once per backend per process: a second graph is reported in the set, not warned again
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        cs2 = generate.generate_candidates(rg, [bad])
    assert not _said(again, "torch-raising")
    assert "torch-raising" in cs2.unavailable


def test_the_flow_reports_a_failed_backend_in_unavailable(rg):
    register_backend("torch-raising", lambda: RaisingTorch(RuntimeError("supports_op bug")))
    try:
        with pytest.warns(RuntimeWarning, match="torch-raising"):
            cs = api.make_candidates(api.analyze(tiny_mlp()[0]), "cpu:1", "tvm,torch-raising")
    finally:
        unregister_backend("torch-raising")
    assert "RuntimeError: supports_op bug" in cs.unavailable["torch-raising"]
    assert set(cs.by_backend()) == {"tvm"}


def test_a_check_that_cannot_read_a_call_says_no_and_is_counted(rg):
    # KeyError for one op: those matches are a no, the backend keeps its other candidates
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cs = generate.generate_candidates(rg, [RaisingTorch(KeyError("axes"), ops={"relax.add"})])
    assert not _said(seen, "torch-raising")
    assert cs.by_backend()["torch-raising"] > 0 and "torch-raising" not in cs.unavailable
    rec = cs.check_errors["torch-raising"]
    assert rec["unreadable"] > 0 and rec["failed"] == 0 and rec["answered"] > 0
    assert "relax.add" in rec["first_unreadable"] and "KeyError" in rec["first_unreadable"]
    add_nodes = {v for v in range(rg.graph.num_nodes) if rg.graph.nodes[v].op == "relax.add"}
    assert add_nodes and not any(set(c.nodes) & add_nodes for c in cs if c.backend == "torch-raising")


def test_a_backend_whose_checks_read_no_call_at_all_is_reported(rg):
    # what a TVM API change looks like: every call raises AttributeError
    with pytest.warns(RuntimeWarning, match="'torch-raising'.*no check could read any call"):
        cs = generate.generate_candidates(rg, [RaisingTorch(AttributeError("'Attrs' has no attribute 'axis'"))])
    assert "AttributeError" in cs.unavailable["torch-raising"]
    assert cs.check_errors["torch-raising"]["answered"] == 0


def test_pattern_candidates_without_a_record_raise_the_failure(rg):
    reach = Reach(rg.graph.dag, rg.graph.num_nodes)
    with pytest.raises(RuntimeError, match="supports_op bug"):
        generate.pattern_candidates(rg, RaisingTorch(RuntimeError("supports_op bug")), reach, {})


def _tvm_checks_raise(monkeypatch, exc):
    """TVM's cuBLAS patterns, each with a check that raises ``exc``."""
    real = patterns.registry_patterns("cublas")

    def raising(ctx):
        raise exc

    fake = [SimpleNamespace(name=fp.name, pattern=fp.pattern, check=raising,
                            annotation_patterns=fp.annotation_patterns) for fp in real]
    monkeypatch.setattr(patterns, "registry_patterns", lambda prefix: fake)


def test_tvm_check_failures_reach_the_generator_and_the_coverage(monkeypatch, rg):
    assert patterns.match_nodes(rg, "cublas")  # matches with TVM's real checks
    _tvm_checks_raise(monkeypatch, RuntimeError("TVM check bug"))
    with pytest.raises(PestoError, match=r"cublas\..*RuntimeError: TVM check bug"):
        patterns.match_nodes(rg, "cublas")
    with pytest.warns(RuntimeWarning, match="'cublas'.*RuntimeError: TVM check bug"):
        cs = generate.generate_candidates(rg, [CublasBackend()])
    assert "cublas" in cs.unavailable and "cublas" not in cs.by_backend()


def test_a_tvm_check_that_cannot_read_the_match_says_no(monkeypatch, rg):
    _tvm_checks_raise(monkeypatch, KeyError("lhs"))
    assert patterns.match_nodes(rg, "cublas") == []


# -- heuristics ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_heuristic_that_raises_is_named_in_the_plan_and_warned(monkeypatch, caplog):
    problem = dnn_like_problem(12, cluster="2xV100-nvlink")

    def bug(problem):
        raise RuntimeError("heuristic bug")

    def no_fit(problem):
        raise InfeasibleError("no device holds it")

    monkeypatch.setitem(portfolio.HEURISTIC_SOLVERS, "m-topo", bug)
    monkeypatch.setitem(portfolio.HEURISTIC_SOLVERS, "single", no_fit)
    caplog.set_level(logging.INFO, logger=portfolio.__name__)
    with pytest.warns(RuntimeWarning, match="'m-topo'.*RuntimeError: heuristic bug") as seen:
        plan = solve_ilp(problem, time_limit_s=5, deterministic=True)
    assert not [w for w in seen if "'single'" in str(w.message)]  # an expected failure is logged only
    errs = plan.info["heuristic_errors"]
    assert errs == {"m-topo": "RuntimeError: heuristic bug", "single": "InfeasibleError: no device holds it"}
    assert set(plan.info["heuristic_makespans_s"]) == {"heft", "m-etf", "m-sct"}
    assert any("single" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
    # the throughput objective picks its warm start from the same runs
    with pytest.warns(RuntimeWarning, match="m-topo"):
        tplan = solve_ilp(problem, time_limit_s=5, deterministic=True, objective="throughput", microbatches=4)
    assert set(tplan.info["heuristic_errors"]) == {"m-topo", "single"}


def test_best_heuristic_plan_matches_the_runs():
    problem = dnn_like_problem(12, cluster="2xV100-nvlink")
    runs = portfolio.run_heuristics(problem, exclude=("m-sct",))
    plan, spans = portfolio.best_heuristic_plan(problem, exclude=("m-sct",))
    assert spans == runs.makespans and "m-sct" not in spans and not runs.errors
    assert plan.solver == min(spans, key=spans.get)


# -- pinning ---------------------------------------------------------------------------------
def _no_affinity(monkeypatch):
    def refuse(pid, cores):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "sched_setaffinity", refuse, raising=False)


def test_a_failed_pinning_is_returned_recorded_and_warned(monkeypatch):
    _no_affinity(monkeypatch)
    device = parse_cluster("cpu:1").devices[0]
    got = []
    with pytest.warns(RuntimeWarning, match=f"device {device.name}: the thread could not be pinned"):
        t = threading.Thread(target=lambda: got.append(device_thread.enter_device_thread(device)))
        t.start()
        t.join()
    assert got[0] is not None and "OSError" in got[0] and "Invalid argument" in got[0]
    assert device_thread.pinning_failures() == {device.name: got[0]}


def test_the_executor_reports_workers_it_could_not_pin(monkeypatch):
    cluster = parse_cluster("cpu:2")
    prog = Program(["x"], [Step("call", "a", ["x"], device=0, func="f"), Step("call", "b", ["x"], device=1, func="f")],
                   ("a", "b"), 2)
    vms = {0: {"f": lambda x: x + 1}, 1: {"f": lambda x: x * 2}}
    ex = Executor(prog, vms, cluster)
    try:
        assert ex.pinning_errors == {}
    finally:
        ex.close()
    _no_affinity(monkeypatch)
    with pytest.warns(RuntimeWarning, match="could not be pinned"):
        ex = Executor(prog, vms, cluster)
        try:
            a, b = ex.run([np.ones(2)])  # the workers run all the same
            errs = ex.pinning_errors
        finally:
            ex.close()
    np.testing.assert_allclose(a, 2.0)
    np.testing.assert_allclose(b, 2.0)
    assert set(errs) == {0, 1} and all("OSError" in v for v in errs.values())
    assert set(device_thread.pinning_failures()) == {d.name for d in cluster.devices}
