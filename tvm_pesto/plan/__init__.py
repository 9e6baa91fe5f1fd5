"""Stage 3: plans. A plan is data (device -> ordered ops); a simulator replays it."""
from .plan import Plan
from .problem import Problem
from .simulate import SimResult, simulate

__all__ = ["Plan", "Problem", "SimResult", "simulate"]
