"""The multi-machine executor (``executor="ray"``): one Ray actor per device, one Ray compiled
graph in the plan's order (:mod:`~tvm_pesto.run.ray.executor`). The actors
(:mod:`~tvm_pesto.run.ray.worker`), the program cut into their tasks
(:mod:`~tvm_pesto.run.ray.tasks`), the connection to a Ray cluster or a local head
(:mod:`~tvm_pesto.run.ray.session`), and small programs timed over it
(:mod:`~tvm_pesto.run.ray.timing`, for :mod:`tvm_pesto.costs.calibrate.dispatch`)."""
