"""
Place a PyTorch model across two CPU devices
============================================

This tutorial takes a branchy Inception-style network written in PyTorch through
``torch.export`` into a Relax ``IRModule``, lets tvm-pesto decide for every subgraph which
backend runs it (TVM, ONNX Runtime, PyTorch), on which device and in which order, builds
one module per device, runs them together, compares the run with the plan, and exports the
placed model so that another process runs it with TVM's runtime only.

It runs top to bottom on any machine with two cores; nothing is downloaded (the weights
are random).
"""

######################################################################
# Import the model
# ----------------
# The zoo builds the PyTorch model and imports it with
# ``torch.export.export`` + ``tvm.relax.frontend.torch.from_exported_program``.
# ``TVM_PESTO_TUTORIAL_SIZE`` lets the test suite run the small preset.
import os

import numpy as np

import tvm_pesto
from tvm_pesto import zoo
from tvm_pesto.plan.trace import gantt_png, sim_events

size = os.environ.get("TVM_PESTO_TUTORIAL_SIZE", "small")
out_dir = os.environ.get("TVM_PESTO_TUTORIAL_OUT", "tutorial-out")
os.makedirs(out_dir, exist_ok=True)
model = zoo.load("inception_v3", size)
print(f"imported {model.name} ({size}): input {model.example_inputs[0].shape}")

######################################################################
# Look at the operator graph
# --------------------------
# ``analyze`` extracts one node per operator call, then groups operators the way TVM's
# fusion would (a convolution with its bias add and ReLU is one group). Groups are what
# gets placed.
analysis = tvm_pesto.analyze(model.mod)
g = analysis.op_graph
print(f"{g.num_nodes} operators, {analysis.graph.num_nodes} fused groups, "
      f"{g.total_flops() / 1e6:.1f} MFLOP")

######################################################################
# Describe the devices
# --------------------
# ``cpu:2`` splits this machine's cores into two devices, each pinned to its own cores.
# Measuring the links fits the ``latency + bytes / bandwidth`` model used by the planner.
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.cluster.linkbench import measure_links

cluster = parse_cluster("cpu:2")
measure_links(cluster)
print(f"link 0->1: {cluster.latency[0, 1] * 1e6:.1f} us + bytes / {cluster.bandwidth[0, 1] / 1e9:.1f} GB/s")

######################################################################
# Place: backend, device and order
# --------------------------------
# First placement alone: ``backends="tvm"`` places TVM's fusion groups. Costs are measured
# per group on the real device (and cached on disk, so a second run measures nothing);
# HEFT assigns devices and orders.
placement = tvm_pesto.place(analysis, cluster, backends="tvm", solver="heft", costs="measured")
print(placement.plan.to_text(placement.problem.graph, width=120))
print(f"TVM alone: simulated makespan {placement.sim.makespan * 1e3:.2f} ms")

######################################################################
# Then the whole question: every backend available here offers candidates (TVM's fusion
# groups and their pieces, ONNX Runtime regions, PyTorch op chains); the bundled XGBoost
# cost model predicts each one on each device, and the joint solve picks a cover, devices
# and orders together.
placement = tvm_pesto.place(analysis, cluster, backends="all", solver="heft", costs="xgb")
print(f"{len(placement.candidates)} candidates {placement.candidates.by_backend()}")
print(f"chosen: {placement.backend_mix} (ops per backend) on devices {placement.plan.devices_used()}")
print(f"simulated makespan: {placement.sim.makespan * 1e3:.2f} ms ({placement.solver_status})")

######################################################################
# Build one module per device and run
# -----------------------------------
# ``build`` with the plan lowers exactly those units (library units become
# ``R.call_dps_packed`` calls) and compiles each device's segments.
placed = tvm_pesto.build(model.mod, cluster, plan=placement.plan)
out = placed(*model.example_inputs)
ref = zoo.torch_reference(model)
print(f"max |placed - torch| = {np.abs(out - ref).max():.2e}")
stats = placed.benchmark(*model.example_inputs, repeat=10)
print(f"measured: {stats['median_s'] * 1e3:.2f} ms (simulated {placement.sim.makespan * 1e3:.2f} ms)")

######################################################################
# Plan against reality
# --------------------
# The Gantt chart shows the simulated schedule above and one measured run below.
from tvm_pesto.plan.trace import trace_events

_, trace = placed.run_traced(*model.example_inputs)
gantt_png(sim_events(placement.problem, placement.plan, placement.sim), os.path.join(out_dir, "gantt.png"),
          title="inception_v3 simulated", device_names=[d.name for d in cluster.devices],
          compare=trace_events(trace))
print(f"wrote {os.path.join(out_dir, 'gantt.png')}")

######################################################################
# Deploy
# ------
# ``export`` writes the per-device libraries, each library unit's artifact (an ONNX file
# for ONNX Runtime) and the plan; ``tvm_pesto.load`` runs it without searching, measuring
# or compiling (it works with ``TVM_USE_RUNTIME_LIB=1`` and no compiler library).
bundle = placed.export(os.path.join(out_dir, "inception-bundle"))
loaded = tvm_pesto.load(bundle)
print(f"loaded bundle gives the same output: {np.array_equal(loaded(*model.example_inputs), out)}")
placed.close()
