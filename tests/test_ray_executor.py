"""The Ray executor: zoo models of three shapes (a transformer, an MLP-Mixer, a CNN) placed over
two CPU devices and run as two Ray actors compute what PyTorch computes (every zoo model runs
placed on the thread executor in ``test_placed_zoo.py``; the executors run the same program);
faults (a failing segment, an actor that dies, a run past its timeout, an actor Ray cannot
place) raise clear errors, hang nothing and clean up; links are measured over Ray; a local Ray
head started here listens on 127.0.0.1 only.

One local Ray (2 CPUs) serves the whole module; it is shut down at the end."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

pytest.importorskip("ray.dag", reason="the Ray executor needs ray[cgraph]: pip install 'tvm-pesto[distributed]'")

import tvm_pesto  # noqa: E402
from tvm_pesto import zoo  # noqa: E402
from tvm_pesto.builder.placed import PlacedModule  # noqa: E402
from tvm_pesto.builder.rewrite import apply_plan  # noqa: E402
from tvm_pesto.candidates import placement_candidates  # noqa: E402
from tvm_pesto.cluster import Cluster, parse_cluster  # noqa: E402
from tvm_pesto.errors import ExecutionError  # noqa: E402
from tvm_pesto.plan import Plan  # noqa: E402
from tvm_pesto.run.program import Program, Step  # noqa: E402
from tvm_pesto.run.ray.executor import (RayExecutor, RaySession, schedule,  # noqa: E402
                                        use_ray)

pytestmark = pytest.mark.slow  # Ray actors in processes of their own: out of the `-m "not slow"` lane


@pytest.fixture(scope="module")
def ray_session():
    import ray

    if ray.is_initialized():  # another module's Ray: this module wants its own
        ray.shutdown()
    session = RaySession(num_cpus=2)
    assert session.owned
    yield session
    session.close()
    assert not ray.is_initialized()


def _alternating(an):
    """Groups alternate between the two devices along a topological order: the most
    cross-device values a plan can have."""
    order = an.graph.topo_order()
    pos = {v: k for k, v in enumerate(order)}
    assignment = np.array([pos[v] % 2 for v in range(an.graph.num_nodes)])
    return Plan.from_assignment(assignment, [pos[v] for v in range(an.graph.num_nodes)], 2, solver="alternate",
                                units=list(placement_candidates(an.rg, an.groups)))


def _placed(name, cluster=None):
    cluster = cluster or parse_cluster("cpu:2")
    zm = zoo.load(name, "small")
    an = tvm_pesto.analyze(zm.mod)
    plan = _alternating(an)
    return zm, PlacedModule(apply_plan(an.rg, plan, cluster), cluster, plan)


def _close(name, out, ref):
    outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        scale = max(1.0, float(np.abs(r).max()))
        assert np.abs(o - r).max() <= 1e-4 * scale, f"{name}: max err {np.abs(o - r).max()}"


#: token ids and attention, every value alternating between the two actors; an MLP-Mixer runs
#: on Ray in the build, load and fault tests below, a CNN (vgg11) in the dying-actor test
RAY_MODELS = ["bert"]


@pytest.mark.parametrize("name", RAY_MODELS)
def test_ray_executor_matches_torch_on_zoo_models(name, ray_session):
    zm, pm = _placed(name)
    threads = pm(*zm.example_inputs)
    ex = use_ray(pm, session=ray_session)
    try:
        out = pm(*zm.example_inputs)
        _close(name, out, zoo.torch_reference(zm))
        _close(name, out, threads)  # the same modules, the same numbers
        _, trace = pm.run_traced(*zm.example_inputs)
        assert {t.device for t in trace if t.kind == "compute"} == {0, 1}
        assert any(t.kind == "copy" for t in trace)
        assert all(0 <= t.start <= t.end for t in trace)
        calls = {s.func for s in pm.program.calls()}
        assert {t.name for t in trace if t.kind == "compute"} == calls  # every segment ran, once each
        info = ex.actor_info
        assert info[0]["pid"] != info[1]["pid"] != os.getpid()  # two processes, neither this one
        assert info[0]["cores"] == list(pm.cluster.devices[0].cpu_ids)  # pinned to the device's cores
    finally:
        pm.close()
    assert ex.closed and ray_session.owned  # the executor did not end the session it was given


def test_build_and_load_with_the_ray_executor(ray_session, tmp_path):
    """The user's entry points: ``tvm_pesto.build(..., executor="ray")`` and
    ``tvm_pesto.load(path, executor="ray")`` run on Ray actors and compute what PyTorch
    computes; an object without ``run``/``close`` is refused as an executor."""
    zm = zoo.load("mlp_mixer", "small")
    an = tvm_pesto.analyze(zm.mod)
    ref = zoo.torch_reference(zm)
    pm = tvm_pesto.build(zm.mod, "cpu:2", plan=_alternating(an), executor="ray")
    try:
        ex = pm._executor
        assert isinstance(ex, RayExecutor)
        _close("build", pm(*zm.example_inputs), ref)
        assert set(ex.actor_info) == {0, 1}
        pm.export(str(tmp_path / "bundle"))
    finally:
        pm.close()
    rt = tvm_pesto.load(str(tmp_path / "bundle"), executor="ray")
    try:
        assert isinstance(rt._executor, RayExecutor) and rt._executor.bundle == str(tmp_path / "bundle")
        _close("load", rt(*zm.example_inputs), ref)
        with pytest.raises(ExecutionError, match="is not an executor: it has no run"):
            rt.use_executor(object())
    finally:
        rt.close()
    assert ray_session.owned and ex.closed
    with pytest.raises(tvm_pesto.PestoError, match="unknown executor 'dask'"):
        tvm_pesto.build(zm.mod, "cpu:2", plan=_alternating(an), executor="dask")


def test_ray_schedule_sends_fields_not_tuples():
    """A tuple made on device 1 whose fields device 0 reads: device 1 takes the fields and
    sends each; inputs go straight from the caller to every device that reads them."""
    steps = [Step("call", "t", ["in:x"], device=1, func="f"),
             Step("item", "a", ["t"], index=0), Step("copy", "a0", ["a"], device=0),
             Step("item", "b", ["t"], index=1), Step("copy", "b0", ["b"], device=0),
             Step("call", "y", ["a0", "b0", "in:x"], device=0, func="g")]
    sc = schedule(Program(["in:x"], steps, ("y", "b0"), 2))
    (t1,), (t0,) = sc.tasks[1], sc.tasks[0]
    assert t1.sends == ["a", "b"] and t1.sources == [("input", 0)]
    assert t0.sources == [("task", 1, 0), ("input", 0)]
    assert [op for op in t0.ops if op[0] == "recv"] == [("recv", 0, "a"), ("recv", 0, "b"), ("recv", 1, "in:x")]
    assert sc.order == [(1, 0), (0, 0)]
    assert sc.output == ("tuple", [("task", 0, 0, "y"), ("task", 1, 0, "b")])
    with pytest.raises(ExecutionError, match="no earlier step makes"):
        schedule(Program(["in:x"], [Step("call", "y", ["nope"], func="g")], "y", 1))


def test_ray_failing_segment_and_run_past_its_timeout(ray_session):
    zm, pm = _placed("mlp_mixer")
    ex = use_ray(pm, session=ray_session)
    ref = zoo.torch_reference(zm)
    try:
        bad = [np.zeros((1, 3, 5, 5), dtype="float32")]
        with pytest.raises(ExecutionError, match=r"device 0 \(cpu0\) failed in segment dev0_seg0") as err:
            pm(*bad)
        assert err.value.device == 0
        pid = ex.actor_info[0]["pid"]
        _close("mlp_mixer", pm(*zm.example_inputs), ref)  # the graph stays usable: same actors
        assert ex.actor_info[0]["pid"] == pid
        ex.timeout_s = 1e-4
        t = time.monotonic()
        with pytest.raises(ExecutionError, match=r"returned nothing within 0.0001 s.*actors were killed"):
            pm(*zm.example_inputs)
        assert time.monotonic() - t < 30 and not ex.actors and ex.graph is None  # a hang guard
        ex.timeout_s = 60
        _close("mlp_mixer", pm(*zm.example_inputs), ref)  # new actors
        assert ex.actor_info[0]["pid"] != pid
    finally:
        pm.close()


def test_ray_actor_that_dies(ray_session):
    import ray

    zm, pm = _placed("vgg11")
    ex = use_ray(pm, session=ray_session)
    try:
        pm(*zm.example_inputs)
        pid = ex.actor_info[1]["pid"]
        ray.kill(ex.actors[1])
        t = time.monotonic()
        with pytest.raises(ExecutionError, match=r"the actor of device 1 \(cpu1\) died.*next run starts new"):
            pm(*zm.example_inputs)
        assert time.monotonic() - t < 20
        assert not ex.actors and ex.graph is None  # killed and torn down
        _close("vgg11", pm(*zm.example_inputs), zoo.torch_reference(zm))  # new actors
        assert ex.actor_info[1]["pid"] != pid
        old = [i["pid"] for i in ex.actor_info.values()]
    finally:
        pm.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in old):
        time.sleep(0.1)
    assert not any(_alive(p) for p in old), "close() left an actor process running"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_ray_actor_ray_cannot_place(ray_session, tmp_path):
    zm, pm = _placed("gpt2")
    d = pm.cluster.to_dict()
    d["devices"][1]["cores"] = 64  # more CPUs than the local Ray has
    big = Cluster.from_dict(d)
    ex = RayExecutor(pm.program, big, pm.export(str(tmp_path / "b")), ray_session)
    t = time.monotonic()
    with pytest.raises(ExecutionError, match=r"need 65 CPU.*device 1 \(cpu1\) alone 64.*has 2 in all"):
        ex.run([np.asarray(x) for x in zm.example_inputs])
    assert time.monotonic() - t < 30 and not ex.actors  # a hang guard: refused before any actor waits
    ex.close()
    pm.close()


def test_ray_head_listens_on_loopback_only(ray_session):
    import psutil
    ray_procs = [p for p in psutil.process_iter(["name", "cmdline"])
                 if p.info["name"] in ("raylet", "gcs_server")]
    assert ray_procs, "no raylet / gcs_server process found"
    listening = []
    for p in ray_procs:
        try:
            listening += [c.laddr for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
        except psutil.AccessDenied:
            pytest.skip("listing sockets needs privileges here")
    assert listening and all(a.ip in ("127.0.0.1", "::ffff:127.0.0.1") for a in listening), listening
    assert ray_session.node_address == "127.0.0.1"


def test_ray_cli_run_json(ray_session, tmp_path):
    """``tvm-pesto run ... --executor ray --refit``: the keys the issue checks, the Ray link model
    and the Ray executor's dispatch fit, as measured and kept."""
    import json

    from click.testing import CliRunner

    from tvm_pesto.cli.main import cli

    out = tmp_path / "out.json"
    # the plan as placed, on Ray (the final choice among other options runs on threads: test_decide.py)
    res = CliRunner().invoke(cli, ["run", "mlp_mixer", "--size", "small", "--cluster", "cpu:2", "--backends", "tvm",
                                   "--costs", "roofline", "--solver", "m-topo", "--executor", "ray", "--repeat", "3",
                                   "--refit", "--json", str(out)], env={"TVM_PESTO_MEASURE_FINAL": "0"})
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["executor"] == "ray" and r["max_abs_err"] <= 1e-4 and r["decision"]["measured"] is False
    assert r["measured_s"] > 0 and r["simulated_s"] > 0 and r["devices_used"]
    assert r["link_model"]["engine"] == "ray" and set(r["link_model"]["pairs"]) == {"0->1", "1->0"}
    assert r["links"]["latency_s"][0][1] == r["link_model"]["pairs"]["0->1"]["latency_s"]
    for p in r["link_model"]["pairs"].values():  # --refit measured them over Ray now
        # seconds and bytes per second, measured (a copy through Ray's object store: hundreds of
        # MB/s on a quiet machine, a few while other jobs load both cores): only bounds no load breaks
        assert 0 < p["latency_s"] < 10 and p["bandwidth_Bps"] > 0
        assert all(1e-6 < t < 10 for t in p["points"].values()), p["points"]  # a real hand-over: over 1 us
    assert ray_session.owned  # the CLI used the Ray already running and left it running
    # the dispatch fit --refit kept: each program timed through the Ray executor itself
    from tvm_pesto.costs.calibrate import dispatch as rd

    rec = rd.load_constants(rd.constants_path(parse_cluster("cpu:2"), "ray"))
    t, fit = rec["programs_s"], rec["dispatch"]
    assert rec["executor"] == "ray" and set(t) == {"one", "one_large", "there", "back"}
    assert 0 < t["one"] < 10 and t["there"] > 2 * rec["add_s"]
    assert fit["handoff_s"] == pytest.approx(max(t["back"] - t["there"] - rec["add_s"], 0.0))
    assert fit["run_s"] == pytest.approx(t["one"] - rec["add_s"])
    # the caller's hop of 1 MiB in and 1 MiB back, over the four floats': seconds per byte
    assert fit["caller_s_per_byte"] == pytest.approx(max((t["one_large"] - t["one"] - rec["add_large_s"]
                                                          + rec["add_s"]) / (2 << 20), 0.0))
    assert fit["caller_s_per_byte"] < 1e-6  # at least a megabyte a second
    assert r["dispatch"]["executor"] == "ray" and r["dispatch"]["source"] == "measured"
    assert r["dispatch"]["run_s"] == pytest.approx(fit["run_s"])


def test_rebind_runs_another_program_on_the_actors_it_started(ray_session, tmp_path):
    """``RayExecutor.rebind``: a program over devices already started runs on the same actors
    (what the dispatch fit times its three programs on); one that needs a device not started
    gets new actors on its next run; an actor that died is reported and replaced on the next
    run; every program computes what it should."""
    from tvm_pesto.costs.calibrate.dispatch import _kernels, dispatch_programs
    from tvm_pesto.run.ray.timing import write_bundle

    cluster = parse_cluster("cpu:2")
    progs = dispatch_programs(cluster, 0, 1)
    bundle = write_bundle(str(tmp_path), {d: _kernels(cluster.devices[d])[2] for d in (0, 1)})
    x = np.zeros(4, np.float32)
    ex = RayExecutor(progs["one"], cluster, bundle, ray_session)
    try:
        assert ex.run([x]).numpy().tolist() == [1.0] * 4 and set(ex.actor_info) == {0}
        ex.rebind(progs["back"])  # device 1 has no actor: the next run starts them
        assert ex.run([x]).numpy().tolist() == [3.0] * 4 and set(ex.actor_info) == {0, 1}  # three adds of one
        pids = {d: i["pid"] for d, i in ex.actor_info.items()}
        for name, adds in (("one", 1), ("there", 2), ("back", 3)):
            ex.rebind(progs[name])
            assert ex.run([x]).numpy().tolist() == [float(adds)] * 4, name
            assert {d: i["pid"] for d, i in ex.actor_info.items()} == pids, name  # no actor started
        import ray

        ray.kill(ex.actors[1])  # an actor that cannot take the next program: a clear error, then new actors
        with pytest.raises(ExecutionError, match=r"device 1 \(cpu1\) did not take the new program.*next run starts"):
            ex.rebind(progs["there"])
        assert ex.run([x]).numpy().tolist() == [2.0] * 4 and ex.actor_info[1]["pid"] != pids[1]
    finally:
        ex.close()
