"""
Place a model over two Ray workers
==================================

The thread executor runs every device in one process. The Ray executor runs each device as
a Ray actor, a process of its own (on this machine, or on the host of the device in a Ray
cluster), and drives them with one Ray compiled graph that follows the plan's order; values
move between devices over Ray channels.

This tutorial starts a local Ray on 127.0.0.1, measures what a transfer between two actors
and a run over them cost, places an Inception-style network for the Ray executor, runs it
on Ray actors and draws the plan beside the measured run. It runs on any machine with two cores; nothing is
downloaded.

A Ray cluster runs any task submitted to it, and a TVM RPC server runs any module uploaded
to it: keep both on 127.0.0.1 or a trusted network (docs/distributed.md).
"""

######################################################################
# Start Ray
# ---------
# ``RaySession()`` starts a local Ray with this machine's cores, listening on 127.0.0.1 only;
# ``RaySession(address="ray://...")`` or ``address="HOST:PORT"`` joins an existing cluster
# instead (tvm-pesto must be installed on its nodes).
import os

import numpy as np

import tvm_pesto
from tvm_pesto import zoo
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs.calibrate.dispatch import machine_dispatch
from tvm_pesto.plan.trace import gantt_png, sim_events, trace_events
from tvm_pesto.run.ray.executor import RaySession, use_ray

size = os.environ.get("TVM_PESTO_TUTORIAL_SIZE", "small")
out_dir = os.environ.get("TVM_PESTO_TUTORIAL_OUT", "tutorial-out")
os.makedirs(out_dir, exist_ok=True)
session = RaySession()
print(f"Ray runs on {session.node_address}")

######################################################################
# What Ray costs: links and dispatch
# ----------------------------------
# One actor per device, as the executor makes them. A tensor of each size goes from one to
# the other the way the executor sends it (the sending task's output, written to a Ray
# channel; the receiver copies it into a TVM tensor on its device), and small programs time
# what a run costs the executor on one actor and over two. The fit is the planner's
# ``latency + bytes / bandwidth`` per link, and a dispatch cost per run: far more than a
# hand-off between two threads, so fewer cuts pay. It is kept per machine (the measurement
# cache's ``machine/`` folder) and read back next time (``refit=True`` measures again;
# ``$TVM_PESTO_MACHINE_CALIBRATION=off`` assumes figures instead); ``place(...,
# executor="ray")`` makes the same fit on first use.
cluster = parse_cluster("cpu:2")
fit = machine_dispatch(cluster, "ray", session=session)  # source: measured now, cached, or assumed
for i, j in ((0, 1), (1, 0)):
    print(f"link {i}->{j}: {cluster.latency[i, j] * 1e6:.0f} us + bytes / {cluster.bandwidth[i, j] / 1e9:.1f} GB/s")
print(f"a run: {fit['run_s'] * 1e6:.0f} us on one actor, {fit['multi_device_s'] * 1e6:.0f} us over several "
      f"({fit['source']})")

######################################################################
# Place for the Ray executor
# --------------------------
# The costs of TVM's fusion groups are measured on the devices (and cached); HEFT places
# and orders them with Ray's links, and the simulator predicts the run with Ray's dispatch.
# ``executor="ray"`` matters: a plan for the thread executor would be made with the links of
# threads, and links measured over Ray are not replaced silently (it is refused).
model = zoo.load("inception_v3", size)
placement = tvm_pesto.place(model.mod, cluster, backends="tvm", solver="heft", costs="measured", executor="ray")
print(f"{placement.problem.num_nodes} units on devices {placement.plan.devices_used()}, "
      f"simulated {placement.sim.makespan * 1e3:.2f} ms")

######################################################################
# Run on Ray actors
# -----------------
# ``use_ray`` exports the built model to a bundle, starts one actor per device the plan uses
# (pinned to the device's cores), each loading its own library with TVM's runtime, and
# compiles the graph. The placed module is then called as before. HEFT moves a branch to the
# second device only where it saves more than Ray's crossings cost: on a 2-core AMD EPYC VM
# at size small it kept all 135 units on one actor (12.7 ms measured, 9.75 ms simulated),
# where a plan made with the thread executor's links split them over both and ran in 25.9 ms.
placed = tvm_pesto.build(model.mod, cluster, plan=placement.plan)
executor = use_ray(placed, session=session)
out = placed(*model.example_inputs)
print(f"max |ray - torch| = {np.abs(out - zoo.torch_reference(model)).max():.2e}")
print(f"actors: {[(d, i['pid'], i['cores']) for d, i in executor.actor_info.items()]}")
stats = placed.benchmark(*model.example_inputs, repeat=10)
print(f"measured {stats['median_s'] * 1e3:.2f} ms, simulated {placement.sim.makespan * 1e3:.2f} ms "
      f"(load average {os.getloadavg()[0]:.2f})")

######################################################################
# Plan beside the run
# -------------------
# Above, the simulated schedule with its transfers; below, one measured run: each actor's
# segments, and (grey) each value a device receives, from when it could take it to when it
# holds it as a TVM tensor.
_, trace = placed.run_traced(*model.example_inputs)
path = os.path.join(out_dir, "ray_gantt.png")
gantt_png(sim_events(placement.problem, placement.plan, placement.sim), path,
          title="inception_v3 simulated with Ray's links", device_names=[d.name for d in cluster.devices],
          compare=trace_events(trace))
print(f"wrote {path}")

######################################################################
# Clean up
# --------
# ``close`` kills the actors and tears the graph down; the session stops the Ray it started.
placed.close()
session.close()
