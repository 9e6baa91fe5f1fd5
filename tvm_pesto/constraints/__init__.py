"""The user's say over a placement: pin or forbid a backend or device for any part of the
model, and cap a device's memory (issue 55).

:mod:`~tvm_pesto.constraints.spec` holds the records (:class:`Pin`, :class:`Forbid`,
:class:`MemoryCap`, :class:`Constraints`) and their command-line spellings;
:mod:`~tvm_pesto.constraints.resolve` binds them to a model's op graph and a cluster
(:func:`resolve`, :class:`NodeConstraints`). The flow applies them once, where it makes the
candidates and their costs (:func:`tvm_pesto.placing.cost_candidates`): every solver, and the
final choice's options, see only what honours them.
"""
from .resolve import NodeConstraints, check_names, matching_nodes, node_names, resolve
from .spec import Constraints, Forbid, MemoryCap, Pin, as_constraints, parse_size

__all__ = ["Constraints", "Forbid", "MemoryCap", "NodeConstraints", "Pin", "as_constraints", "check_names",
           "matching_nodes", "node_names", "parse_size", "resolve"]
