"""Stage 4: plans. A plan is data (device -> ordered units); a simulator replays it."""
from .plan import Plan
from .problem import JointProblem, Problem
from .simulate import SimResult, simulate

__all__ = ["JointProblem", "Plan", "Problem", "SimResult", "simulate"]
