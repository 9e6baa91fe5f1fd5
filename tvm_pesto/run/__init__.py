"""Stage 5: run per-device modules together and record what really happened."""
from .executor import Executor, TraceEvent
from .program import Program, read_program, split_by_device

__all__ = ["Executor", "Program", "TraceEvent", "read_program", "split_by_device"]
