"""Stage 6: run per-device modules together and record what really happened.

Nothing here needs TVM's compiler: a deployed bundle runs with TVM's runtime only.
"""
from .executor import Executor, TraceEvent
from .program import Program, Step

__all__ = ["Executor", "Program", "Step", "TraceEvent"]
