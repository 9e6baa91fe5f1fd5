"""The cost-model lab of tvm-pesto: what makes and judges the learned cost model, apart from
the product (the distribution ``tvm-pesto-lab``, ``pip install ./lab`` from a checkout).

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
* :mod:`.families` and :mod:`.generalization`: the architecture family of every row's model,
  and the recipe judged on families and sizes it never trained on (``tvm-pesto cost-model
  eval --holdout family``, ``--train-size small --eval-size full``);
* :mod:`.timing_noise` and :mod:`.unscheduled_kernels`: the measurements behind the timing
  method and two of the model's features (``python -m tvm_pesto_lab.timing_noise``,
  ``python -m tvm_pesto_lab.unscheduled_kernels``);
* :mod:`.cli`: the ``tvm-pesto`` verbs above, which the product's CLI loads through the
  entry-point group ``tvm_pesto.cli`` (``lab/pyproject.toml``).

The lab imports the product; the product never imports the lab (``tests/test_architecture.py``
checks it).
"""
