"""Lower bounds on any plan of a placement problem, to judge how far a plan is from optimal.

``paths`` (critical paths), ``makespan`` (critical path, work, LP relaxation), ``comm``
(bounds that charge for transfers and memory: segments, path memory) and ``objective``
(bounds for every model and objective).
The stage model's own bound is :mod:`tvm_pesto.solve.stage.bounds`.
"""
