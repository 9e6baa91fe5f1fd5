"""This machine's figures, fitted on first use and kept: the learned model's calibration
(:mod:`.machine`: a few small zoo models' units measured here and predicted, an affine
correction per backend and device fitted on them) and the executors' dispatch, links and the
devices' contention (:mod:`.dispatch`, timed through the runtime), and beside them what a
switch between libraries costs on a device (:mod:`.switch`). The calibration itself (its fit,
file and lookup) is :mod:`tvm_pesto.costs.predict.calibration`, since every ``xgb``
prediction applies it.

Imports the cost sources' entry (:func:`tvm_pesto.costs.candidate_costs`),
:mod:`tvm_pesto.costs.predict`, :mod:`tvm_pesto.costs.store` and the runtime (:mod:`tvm_pesto.run`):
the top of :mod:`tvm_pesto.costs`.
"""
