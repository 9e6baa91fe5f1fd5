"""Stage 1: the operator graph, from a Relax IRModule or an imported benchmark file."""
from .opgraph import OpGraph, OpNode, TensorSpec, dtype_bytes

__all__ = ["OpGraph", "OpNode", "TensorSpec", "dtype_bytes"]
