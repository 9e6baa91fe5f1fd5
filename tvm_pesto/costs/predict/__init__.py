"""Predicting a candidate's seconds without timing it: FLOPs and bytes over peak
(:mod:`.roofline`), the learned model's features (:mod:`.features`), the model file and the
``xgb`` source (:mod:`.xgb`), the whole-model calibration the model's predictions carry
(:mod:`.calibration`), the device check's timings of a GPU (:mod:`.gpu_check`), and the
``hybrid`` source, which measures what the prediction is unsure of (:mod:`.hybrid`).

Imports :mod:`tvm_pesto.costs.store`, :mod:`tvm_pesto.costs.table` and (``hybrid``, lazily)
:mod:`tvm_pesto.costs.measure`.
"""
