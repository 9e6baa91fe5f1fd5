"""Exceptions raised by tvm-pesto.

Every error a user can cause derives from :class:`PestoError`, so a caller can catch one
type at the boundary. Each message names the problem and what would fix it.
"""


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
