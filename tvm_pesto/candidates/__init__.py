"""Stage 2: candidate subgraphs per backend (Collage-style) and their validity."""
from .generate import (  # noqa: F401
    Candidate, CandidateSet, Reach, candidate_function, candidate_outputs, combined_acyclic, convex_regions,
    generate_candidates, is_valid, pattern_candidates, placement_candidates, region_windows, tvm_candidates,
)

__all__ = ["Candidate", "CandidateSet", "Reach", "candidate_function", "candidate_outputs", "combined_acyclic",
           "convex_regions", "generate_candidates", "is_valid", "pattern_candidates", "placement_candidates",
           "region_windows",
           "tvm_candidates"]
