"""Fitting the learned model's calibration on this machine (:mod:`.machine`): a few small
zoo models' units measured here and predicted, an affine correction per backend and device
fitted on them. The calibration itself (its fit, file and lookup) is
:mod:`tvm_pesto.costs.predict.calibration`, since every ``xgb`` prediction applies it.

Imports the cost sources' entry (:func:`tvm_pesto.costs.candidate_costs`),
:mod:`tvm_pesto.costs.predict` and :mod:`tvm_pesto.costs.store`: the top of :mod:`tvm_pesto.costs`.
"""
