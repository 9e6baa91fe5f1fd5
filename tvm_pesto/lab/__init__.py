"""The cost-model lab: what makes and judges the learned cost model, apart from the product.

A placement needs only what :mod:`tvm_pesto.costs` holds: the cost sources, the trained
model file and its prediction (:mod:`tvm_pesto.costs.predict.xgb`), calibration, the measurement
cache. This package holds what produces that model and tells how good it is, off line:

* :mod:`.sweep`: synthetic Relax modules of op shapes the zoo does not cover;
* :mod:`.profile`: measure every candidate of a model and log the training records
  (``tvm-pesto profile``, ``tvm-pesto cost-model merge``);
* :mod:`.tuning_rows`: MetaSchedule databases read as training rows;
* :mod:`.dataset` and :mod:`.fit`: read the rows and fit the model
  (``tvm-pesto cost-model train``);
* :mod:`.metrics`, :mod:`.evaluate` and :mod:`.flow_eval`: judge it on the profiler's
  records and on the product's own path (``tvm-pesto cost-model eval``);
* :mod:`.timing_noise` and :mod:`.unscheduled_kernels`: the measurements behind the timing
  method and two of the model's features (``python -m tvm_pesto.lab.timing_noise``,
  ``python -m tvm_pesto.lab.unscheduled_kernels``).

Nothing in the product imports this package: only the CLI's cost-model verbs
(:mod:`tvm_pesto.cli.cost_model`) and the lab's own modules do
(``tests/test_architecture.py`` checks it). The lab may import the packages up to the cost
layer (``docs/architecture.md``, "Layers").
"""
