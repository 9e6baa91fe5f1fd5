"""The one flow: analyze -> candidates -> costs -> solve -> choose -> build -> run.

Every entry point walks it: :func:`build` (Python), :class:`PlacementPass` (inside a TVM
compile flow), and the CLI verbs ``demo``, ``run`` and ``place``. :func:`build` is
:func:`place` (:mod:`tvm_pesto.placing`: candidates, costs, solve) then the final choice
(:func:`tvm_pesto.choose.final.final_choice`: the options measured, the fastest built);
:func:`place` is :func:`cost_candidates` then :func:`place_from_costs`, which callers that
solve one cost table several times (``place --solver all``, the benchmarks' restricted tables)
call apart. This module is the public face of those stages. ``backends`` says which
backends compete for each subgraph: ``"all"`` (every backend available on the cluster's
devices, the default), ``"tvm"`` (TVM's fusion groups only: placement without backend
choice), or a list of names (``tvm`` is always kept: it covers every op).
``deterministic=True`` replaces the solvers' wall-clock budgets by work budgets and fixes
their seeds (:mod:`tvm_pesto.solve.budget`), so the same module, cluster and costs give the
same plan on any machine; ``plan.info["budget"]`` names the mode used.

Examples
--------
>>> import tvm_pesto
>>> from tvm_pesto.candidates.examples import tiny_cnn
>>> mod, (x,) = tiny_cnn()
>>> placed = tvm_pesto.build(mod, "cpu:2", costs="roofline")   # roofline: nothing measured
>>> placed(x).shape
(1, 10)
>>> mix = placed.plan.backend_mix()   # ops per backend: the flow's plan, or a library's whole model
>>> sum(mix.values()) == tvm_pesto.analyze(mod).op_graph.num_nodes
True
"""
from __future__ import annotations

import tvm

from .backends.base import forget_constants
from .builder.placed import PlacedModule, build_placement
from .builder.program import legalize_on_devices
from .builder.rewrite import apply_plan
from .candidates.flow import backend_names, make_candidates
from .choose import skip_reason
from .choose.decision import Decision
from .choose.final import final_choice
from .cluster import as_cluster
from .costs.calibrate.machine import calibrate_machine
from .errors import PestoError
from .graph.analysis import Analysis, analyze
from .placing import CostedCandidates, Request, cost_candidates, estimate_costs, place, place_from_costs
from .plan import Plan
from .plan.placement import Placement, solver_gap, solver_status
from .solve import budget


def build(mod, cluster, backends="all", solver: str = "auto", costs="auto", plan: Plan | None = None, cache=None,
          progress=None, deterministic: bool | None = None, executor: str = "thread", ray_address: str | None = None,
          measure_final: bool | None = None, inputs=None, constraints=None, **solver_options):
    """Place ``mod`` on ``cluster`` (or apply a given ``plan``) and build one module per device.

    ``deterministic`` and ``solver_options`` go to :func:`place` (``max_build_s=`` among them:
    the plan's library builds within that many seconds; the whole-model library options of
    the final choice that would not build within it are left out; ``precision="bf16"``: the
    backends that compute in bfloat16 on this CPU compete too). ``executor`` runs the
    devices: ``"thread"`` (one pinned thread per device, this process) or ``"ray"`` (one
    Ray actor per device, :mod:`tvm_pesto.run.ray.executor`: a local Ray on 127.0.0.1, or
    the cluster at ``ray_address``); ``close()`` the module to stop the actors.

    ``measure_final`` (default: on, :data:`tvm_pesto.choose.MEASURE_ENV`): on ``cpu:N``,
    the flow's plan, its plan on the same cores as one device and the whole model in one
    library are built and timed against each other on ``inputs`` (default: seeded random
    inputs) for about two seconds, and the fastest is returned (:mod:`tvm_pesto.choose`);
    ``placed.decision`` lists each option's predicted and measured time.

    ``constraints`` (:mod:`tvm_pesto.constraints`: a ``Constraints`` record, or a dict of
    ``pin``/``forbid``/``device_memory`` spellings as on the command line) are honoured by
    the flow's solvers and by every option of the final choice; one that no plan can honour
    raises a :class:`~tvm_pesto.errors.ConstraintError` before anything is built.

    Returns
    -------
    PlacedModule
        Callable on numpy arrays or TVM tensors; ``.plan``, ``.placement``, ``.decision``,
        ``.export(dir)``.

    Examples
    --------
    >>> import tvm_pesto
    >>> from tvm_pesto.candidates.examples import tiny_cnn
    >>> mod, (x,) = tiny_cnn()
    >>> placed = tvm_pesto.build(mod, "cpu:2", costs="roofline")
    >>> placed(x).shape
    (1, 10)

    With ``executor="ray"`` (starts a local Ray cluster, so not run here):

    >>> placed = tvm_pesto.build(mod, "cpu:2", executor="ray")   # doctest: +SKIP
    >>> y = placed(x); placed.close()                             # doctest: +SKIP
    """
    if executor not in ("thread", "ray"):
        raise PestoError(f"unknown executor {executor!r}; use 'thread' (one pinned thread per device) or 'ray' "
                         "(one Ray actor per device)")
    cluster = as_cluster(cluster)
    if plan is not None and constraints is not None:
        raise PestoError("constraints= apply to the plan the flow makes; a given plan= is applied as it is: leave "
                         "one of them out")
    try:
        if plan is not None:
            analysis = analyze(mod)
            placed = PlacedModule(apply_plan(analysis.rg, plan, cluster), cluster, plan, None, progress=progress)
        else:
            analysis = analyze(mod)
            limit = solver_options.pop("time_limit_s", budget.SOLVE_S)
            solving = budget.Solving(limit, skip_reason(cluster, measure_final) is None, deterministic)
            request = Request(backends, solver, costs, cache, progress, deterministic, executor, limit,
                              solver_options, constraints)
            pl = request.place(analysis, cluster, time_limit_s=solving.flow_s(), leave_whole=solving.measured)
            placed = final_choice(mod, pl, cluster, request, inputs, measure_final, progress, solving)
    finally:
        forget_constants()  # the weights' digests kept for this build: the model is the caller's to drop
    if executor == "ray":
        placed.use_ray(address=ray_address)
    return placed


@tvm.ir.transform.module_pass(opt_level=0, name="tvm_pesto.Place")
class PlacementPass:
    """A module pass that places ``main`` over a cluster: backend, device and order.

    The result compiles with ``tvm.compile`` and runs in ``relax.VirtualMachine`` with one
    device per cluster device, ``[d.tvm_device() for d in cluster.devices]`` (for
    ``cpu:2``: ``[tvm.cpu(0), tvm.cpu(1)]``, TVM's convention that vdevice ``i`` is device
    id ``i``): one ``vdevice`` per device; every segment is a private function whose
    parameters and results carry its device; ``main`` takes its inputs on device 0, moves
    values with ``R.to_vdevice`` and returns on device 0; non-TVM units are
    ``R.call_dps_packed`` calls of functions the pass registered in this process. The
    segments are legalized to TIR calls with their outputs on the segment's device
    (:func:`tvm_pesto.builder.program.legalize_on_devices`). That path is for TVM's own
    VM, which runs one call at a time; :func:`build` runs the devices concurrently.

    The plan is chosen as :func:`build` chooses it: on ``cpu:N`` of this machine the flow's
    plan, its plan on the same cores as one device and each library's whole model are built
    and timed against each other (``measure_final``, ``inputs``: as in :func:`build`), and
    the fastest is the module; a plan the costs predict fast can run slower than one
    library's call (a call right after another library's runs slower than alone).
    Its shape may then be one device on the same cores: the module has one vdevice, and a
    VM given the cluster's devices uses the first. ``last_placement`` keeps what was
    decided, ``last_decision`` each option's predicted and measured time, ``last_cluster``
    the cluster the module is placed on. ``plan=`` applies a given plan instead (e.g. one
    saved from an earlier placement); ``deterministic=True`` places with work budgets and
    measures nothing (see :func:`place`), so a compile flow gives the same module on any
    machine; ``measure_final=False`` keeps the flow's plan unmeasured. ``constraints=``
    pins, forbids and memory caps, as in :func:`build`.

    Examples
    --------
    >>> import tvm
    >>> from tvm import relax
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> mod, (x,) = tiny_mlp()
    >>> seq = tvm.transform.Sequential([PlacementPass("cpu:2", costs="roofline", measure_final=False)])
    >>> ex = tvm.compile(seq(mod))
    >>> vm = relax.VirtualMachine(ex, [tvm.cpu(0), tvm.cpu(0)])
    >>> vm["main"](tvm.runtime.tensor(x)).numpy().shape
    (8, 16)
    """

    def __init__(self, cluster, backends="all", solver: str = "auto", costs="auto", plan: Plan | None = None,
                 deterministic: bool | None = None, measure_final: bool | None = None, inputs=None,
                 constraints=None, **solver_options):
        self.cluster = as_cluster(cluster)
        self.backends = backends
        self.solver = solver
        self.costs = costs
        self.plan = plan  # apply this plan (with units) instead of solving
        self.deterministic = deterministic
        self.measure_final = False if deterministic else measure_final
        self.inputs = inputs
        self.constraints = constraints
        self.solver_options = solver_options
        self.last_placement: Placement | None = None
        self.last_decision: Decision | None = None
        self.last_cluster = None

    def transform_module(self, mod, ctx):
        if self.plan is not None:
            self.last_cluster = self.cluster
            return legalize_on_devices(apply_plan(analyze(mod).rg, self.plan, self.cluster))
        if skip_reason(self.cluster, self.measure_final) is None:
            placed = build(mod, self.cluster, backends=self.backends, solver=self.solver, costs=self.costs,
                           deterministic=self.deterministic, measure_final=self.measure_final, inputs=self.inputs,
                           constraints=self.constraints, **self.solver_options)
            placed.close()  # its units stay registered for the VM's extern calls
            self.last_placement, self.last_decision, self.last_cluster = \
                placed.placement, placed.decision, placed.cluster
            return legalize_on_devices(placed.placed_mod)
        pl = place(mod, self.cluster, backends=self.backends, solver=self.solver, costs=self.costs,
                   deterministic=self.deterministic, constraints=self.constraints, **self.solver_options)
        self.last_placement, self.last_decision, self.last_cluster = pl, None, self.cluster
        return legalize_on_devices(apply_plan(pl.analysis.rg, pl.plan, self.cluster))


__all__ = ["Analysis", "CostedCandidates", "Placement", "PlacementPass", "Request", "analyze", "backend_names", "build",
           "build_placement", "calibrate_machine", "cost_candidates", "estimate_costs", "final_choice",
           "make_candidates", "place", "place_from_costs", "solver_gap", "solver_status"]
