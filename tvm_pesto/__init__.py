"""tvm-pesto: place Relax graphs across devices and backends, jointly, by cost.

The data path is the package layout: ``graph`` -> ``costs`` -> ``plan``/``solve`` ->
``build`` -> ``run``. See :func:`build` for the one-call flow.
"""
from .api import Analysis, Placement, PlacementPass, analyze, build, estimate_costs, place
from .cluster import Cluster, Device, parse_cluster
from .errors import PestoError
from .plan import Plan, Problem, simulate

__version__ = "0.1.0"

__all__ = ["Analysis", "Cluster", "Device", "PestoError", "Placement", "PlacementPass", "Plan", "Problem",
           "analyze", "build", "estimate_costs", "parse_cluster", "place", "simulate"]
