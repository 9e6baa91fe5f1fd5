"""MetaSchedule tuning of a model's kernels into a database (``tvm-pesto tune``,
:mod:`.tune`): its in-process builder and runner (:mod:`.ms_measure`), its loggers beside the
process's own (:mod:`.ms_logging`), and the device a database was timed on (:mod:`.tuning_db`).

Imports :mod:`tvm_pesto.costs.predict.features` (device descriptors) and
:mod:`tvm_pesto.costs.measure.remote` (timing over TVM RPC).
"""
