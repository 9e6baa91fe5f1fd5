"""Backend choice: Collage's DP (one device), the joint backend/placement ILP, and lowering."""
from .collage_dp import CoverResult, brute_force_cover, collage_dp  # noqa: F401
from .joint_ilp import JointResult, joint_ilp  # noqa: F401

__all__ = ["CoverResult", "JointResult", "brute_force_cover", "collage_dp", "joint_ilp"]
