"""
Place a PyTorch model across two CPU devices
============================================

This tutorial takes a branchy Inception-style network written in PyTorch through
``torch.export`` into a Relax ``IRModule``, lets tvm-pesto decide which device runs each
fused operator group and in what order, builds one module per device, runs them together
and compares the run with the plan.

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
# Place
# -----
# Costs are measured per fused group on the real device (and cached on disk, so a second
# run measures nothing); HEFT then assigns devices and orders.
placement = tvm_pesto.place(analysis, cluster, solver="heft", costs="measured")
print(placement.plan.to_text(analysis.graph, width=120))
print(f"simulated makespan: {placement.sim.makespan * 1e3:.2f} ms")

######################################################################
# Build one module per device and run
# -----------------------------------
from tvm_pesto.builder.placed import PlacedModule
from tvm_pesto.builder.rewrite import apply_plan

placed_mod = apply_plan(analysis.rg, analysis.groups, placement.plan, cluster)
placed = PlacedModule(placed_mod, cluster, placement.plan, placement.problem, placement.sim, analysis)
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
placed.close()
