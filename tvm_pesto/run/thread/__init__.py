"""The in-process executor (``executor="thread"``): one worker thread per device, pinned to
its cores (:mod:`~tvm_pesto.run.thread.executor`), one CUDA stream per GPU and the copies
between them (:mod:`~tvm_pesto.run.thread.streams`), and a stream of microbatches pipelined
over the devices (:mod:`~tvm_pesto.run.thread.pipeline`)."""
