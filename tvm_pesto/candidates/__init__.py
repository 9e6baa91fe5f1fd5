"""Stage 2: candidate subgraphs per backend (Collage-style) and their validity."""
from .convex import Reach, combined_acyclic, is_valid  # noqa: F401
from .generate import (  # noqa: F401
    Candidate, CandidateSet, candidate_function, candidate_key, candidate_outputs, generate_candidates,
    pattern_candidates,
    placement_candidates, tvm_candidates,
)
from .regions import region_windows  # noqa: F401

__all__ = ["Candidate", "CandidateSet", "Reach", "candidate_function", "candidate_key", "candidate_outputs",
           "combined_acyclic",
           "generate_candidates", "is_valid", "pattern_candidates", "placement_candidates",
           "region_windows",
           "tvm_candidates"]
