"""Build MetaSchedule's candidate schedules in this process, and time them here or over TVM RPC.

MetaSchedule's LocalBuilder and LocalRunner start worker processes that each import TVM,
which takes tens of seconds on a loaded machine; :class:`InProcessMeasurer` compiles with
the same build function and times in one thread of this process, pinned to a device. For
a remote device (``Device.rpc_key``, :func:`tvm_pesto.costs.measure.remote.remote_cluster`) each
batch of candidates is timed in one session on a server of the key
(:func:`tvm_pesto.costs.measure.remote.remote_session`): every kernel is exported as a ``.so``,
uploaded, and timed there with the same ``time_evaluator`` call on arguments filled there
(MetaSchedule's RPC argument allocator).
:func:`cpu_intrinsics_only` keeps MetaSchedule from parsing the CUDA tensor intrinsics
while tuning for a CPU. Used by :func:`tvm_pesto.costs.tune.tune.tune_model` and
:func:`tvm_pesto_lab.tuning_rows.tune_in_process`.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import sys
import tempfile
import types

from ...errors import CostError
from ..measure.remote import remote_session


class InProcessMeasurer:
    """A MetaSchedule builder and runner that compile and time in this process.

    Timing runs in one worker thread, pinned to ``device``'s cores with a TVM pool of its
    size (:func:`tvm_pesto.cluster.device_thread.enter_device_thread`) when a device is
    given, else with the calling process's pool. A remote ``device`` is timed on a server
    of its RPC key instead, one session per batch; the first session is opened here, so a
    tracker that refuses or a key no server is registered under fails before any tuning.
    ``builder`` and ``runner`` go to MetaSchedule; :meth:`close` stops the thread.
    :attr:`error` is the :class:`~tvm_pesto.errors.CostError` that stopped a remote batch
    (the session ended), which MetaSchedule passes on as its own error.

    Raises
    ------
    CostError
        For a remote device, when no session can be had (:mod:`tvm_pesto.costs.measure.remote`).

    Examples
    --------
    >>> m = InProcessMeasurer()
    >>> from tvm.s_tir.meta_schedule.builder import Builder
    >>> from tvm.s_tir.meta_schedule.runner import Runner
    >>> isinstance(m.builder, Builder), isinstance(m.runner, Runner)   # for tune_tir(..., builder=, runner=)
    (True, True)
    >>> m.close()

    :func:`tvm_pesto_lab.tuning_rows.tune_in_process` is a whole tuning run with one.
    """

    def __init__(self, device=None, min_repeat_ms: int = 0, number: int = 3):
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
        from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerFuture, RunnerResult

        # lazy: loads TVM, which importing this module does not
        from ...cluster.device_thread import enter_device_thread

        self.min_repeat_ms, self.number = int(min_repeat_ms), int(number)
        self.device, self.remote = device, bool(getattr(device, "remote", False))
        self.error: CostError | None = None
        self._built: dict[str, object] = {}
        self._session = None  # the remote session of the batch being timed
        self._uploads = 0
        if self.remote:
            with self.batch():  # the faults of remote.py, before anything is tuned
                pass
        local = device is not None and not self.remote
        self._pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="pesto-ms-timer", initializer=enter_device_thread if local else None,
            initargs=(device,) if local else ())
        me = self

        @derived_object
        class _Builder(PyBuilder):
            def build(self, build_inputs):
                out = []
                for inp in build_inputs:
                    try:
                        # a real folder: MetaSchedule's RemoveBuildArtifact deletes dirname(path)
                        name = os.path.join(tempfile.mkdtemp(prefix="pesto-ms-"), "artifact")
                        me._built[name] = me.build_module(inp.mod, inp.target)
                        out.append(BuilderResult(name, None))
                    except Exception as e:  # noqa: BLE001 - reported to MetaSchedule as a failed build
                        out.append(BuilderResult(None, f"{type(e).__name__}: {e}"))
                return out

        @derived_object
        class _Runner(PyRunner):
            def run(self, runner_inputs):
                futures = []
                try:
                    with me.batch():
                        for inp in runner_inputs:
                            try:
                                res = RunnerResult(me.time_module(me._built.pop(inp.artifact_path), inp.args_info),
                                                   None)
                            except Exception as e:  # noqa: BLE001 - reported as a failed run
                                if me.remote:  # over RPC it is the session's failure (remote_session says so):
                                    raise  # stop tuning, the records so far stay
                                res = RunnerResult(None, f"{type(e).__name__}: {e}")
                            futures.append(RunnerFuture(f_done=lambda: True, f_result=lambda r=res: r))
                except CostError as e:
                    me.error = e
                    raise
                return futures

        self.builder, self.runner = _Builder(), _Runner()

    @staticmethod
    def build_module(mod, target):
        """``mod`` (TIR) compiled as MetaSchedule's LocalBuilder compiles it."""
        from tvm.s_tir.meta_schedule.builder.local_builder import default_build

        return default_build(mod, target, None)

    @contextlib.contextmanager
    def batch(self):
        """Time a batch of kernels in one remote session (opened here, or the open one);
        nothing for a local device.

        Raises
        ------
        CostError
            When the session cannot be had or ends early (any failure inside it).
        """
        if not self.remote or self._session is not None:
            yield
            return
        with remote_session(self.device) as session:
            self._session = session
            try:
                yield
            finally:
                self._session = None

    def time_module(self, rt, args_info) -> list[float]:
        """Seconds per run of a built kernel on random arguments, timed in the device thread
        (or, for a remote device, on the server of the current :meth:`batch`)."""
        import tvm
        from tvm.s_tir.meta_schedule.runner.local_runner import default_alloc_argument

        if self.remote:
            with self.batch():
                return self._time_remote(rt, args_info)

        def work():
            dev = tvm.cpu(0)
            args = default_alloc_argument(dev, [a.as_json() for a in args_info], 1)[0]
            f = rt.time_evaluator(rt.entry_name, dev, number=self.number, repeat=1, min_repeat_ms=self.min_repeat_ms)
            return [float(x) for x in f(*args).results]

        return self._pool.submit(work).result()

    def _time_remote(self, rt, args_info) -> list[float]:
        from tvm.s_tir.meta_schedule.runner.rpc_runner import default_alloc_argument

        session = self._session
        self._uploads += 1  # a fresh name per kernel: the server's loader keeps what it loaded by path
        rmod = session.load(rt, f"pesto_ms_{os.getpid()}_{self._uploads}")
        args = default_alloc_argument(session.sess, session.dev, [a.as_json() for a in args_info], 1)[0]
        f = rmod.time_evaluator(rmod.entry_name, session.dev, number=self.number, repeat=1,
                                min_repeat_ms=self.min_repeat_ms)
        return [float(x) for x in f(*args).results]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._built.clear()


@contextlib.contextmanager
def cpu_intrinsics_only(enabled: bool):
    """Register only the x86 tensor intrinsics while tuning for a CPU.

    MetaSchedule's TuneContext imports ``tvm.s_tir.tensor_intrin``, whose CUDA part parses
    hundreds of TVMScript functions (a minute or more on a loaded machine) that an
    ``llvm`` target never uses. While tuning, the package is stood in by a module that
    shares its ``__path__`` (so ``tensor_intrin.x86`` imports normally); it is removed
    afterwards, so a later full import still registers everything.
    """
    name = "tvm.s_tir.tensor_intrin"
    if not enabled or name in sys.modules:
        yield
        return
    import tvm.s_tir

    pkg_dir = os.path.join(os.path.dirname(tvm.s_tir.__file__), "tensor_intrin")
    stub = types.ModuleType(name)
    stub.__path__ = [pkg_dir]
    sys.modules[name] = stub
    try:
        try:
            import tvm.s_tir.tensor_intrin.x86  # noqa: F401
        except Exception:  # noqa: BLE001 - without x86 intrinsics tuning still works for fp32
            pass
        yield
    finally:
        if sys.modules.get(name) is stub:
            del sys.modules[name]


__all__ = ["InProcessMeasurer", "cpu_intrinsics_only"]
