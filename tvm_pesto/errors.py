"""Exceptions raised by tvm-pesto.

Every error a user can cause derives from :class:`PestoError`, so a caller can catch one
type at the boundary. Each message names the problem and what would fix it;
:func:`error_line` quotes a cause from deep inside TVM, torch or a library in one line.
"""


def error_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, for error messages that quote a cause.

    Torch and TVM errors run to dozens of lines; the first one says what went wrong. Where
    it only announces the reason (it ends with ``:``, as torch's ``backend='inductor'
    raised:``), the next line, which gives it, is added.

    Examples
    --------
    >>> from tvm_pesto.errors import error_line
    >>> error_line(ValueError("bad shape\\nat line 3"))
    'ValueError: bad shape'
    >>> error_line(RuntimeError("backend='inductor' raised:\\nRuntimeError: cannot broadcast\\n\\nSet VERBOSE=1"))
    "RuntimeError: backend='inductor' raised: RuntimeError: cannot broadcast"
    """
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class PestoError(Exception):
    """Base class for all tvm-pesto errors."""


class GraphError(PestoError):
    """The input graph or module cannot be handled (dynamic shapes, cycles, bad ids)."""


class UnsupportedModuleError(GraphError):
    """The Relax module uses a construct tvm-pesto cannot place (e.g. symbolic shapes)."""


class CycleError(GraphError):
    """The graph has a cycle, so no schedule exists."""


class ClusterError(PestoError):
    """A cluster specification is unknown or invalid."""


class CostError(PestoError):
    """Costs could not be measured or predicted."""


class InfeasibleError(PestoError):
    """No plan satisfies the constraints (usually device memory)."""


class ConstraintError(InfeasibleError):
    """A user's constraint (a pin, a forbid, a device memory cap) is malformed, or no plan can
    honour it; the message names the constraint and the reason."""


class SolverError(PestoError):
    """A solver is missing, failed, or returned no usable solution."""


class PlanError(PestoError):
    """A plan is invalid for its graph and cluster (missing node, deadlock, bad order)."""


class BuildError(PestoError):
    """TVM failed to build a per-device module; the message says which part and why."""


class TuningError(PestoError):
    """MetaSchedule tuning cannot start or failed: a bad budget, an unwritable or foreign
    database, or an error inside MetaSchedule (the message names the task)."""


class ExecutionError(PestoError):
    """A placed module failed while running."""


class TrainingError(PestoError):
    """A training setup is invalid: no trainable parameter, an unknown loss or optimizer,
    a loss that does not fit the model's output."""


class UnseenOpsWarning(RuntimeWarning):
    """Costs predicted for candidates holding ops the cost model never trained on: guesses
    (the CLI prints its own line for it; ``costs="hybrid"`` measures them first)."""
