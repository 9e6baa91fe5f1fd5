"""Build and time MetaSchedule's candidate schedules in this process.

MetaSchedule's LocalBuilder and LocalRunner start worker processes that each import TVM,
which takes tens of seconds on a loaded machine; :class:`InProcessMeasurer` compiles with
the same build function and times in one thread of this process, pinned to a device.
:func:`cpu_intrinsics_only` keeps MetaSchedule from parsing the CUDA tensor intrinsics
while tuning for a CPU. Used by :func:`tvm_pesto.costs.tune.tune_model` and
:func:`tvm_pesto.costs.tuning_db.tune_in_process`.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import tempfile


class InProcessMeasurer:
    """A MetaSchedule builder and runner that compile and time in this process.

    Timing runs in one worker thread, pinned to ``device``'s cores with a TVM pool of its
    size (:func:`tvm_pesto.cluster.device_thread.enter_device_thread`) when a device is
    given, else with the calling process's pool. ``builder`` and ``runner`` go to
    MetaSchedule; :meth:`close` stops the thread.

    Examples
    --------
    >>> m = InProcessMeasurer()                                        # doctest: +SKIP
    >>> ms.tune_tir(mod, target, wd, 8, builder=m.builder, runner=m.runner)  # doctest: +SKIP
    >>> m.close()                                                      # doctest: +SKIP
    """

    def __init__(self, device=None, min_repeat_ms: int = 0, number: int = 3):
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
        from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerFuture, RunnerResult

        from ..cluster.device_thread import enter_device_thread

        self.min_repeat_ms, self.number = int(min_repeat_ms), int(number)
        self._built: dict[str, object] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="pesto-ms-timer", initializer=enter_device_thread if device is not None else None,
            initargs=(device,) if device is not None else ())
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
                for inp in runner_inputs:
                    try:
                        res = RunnerResult(me.time_module(me._built.pop(inp.artifact_path), inp.args_info), None)
                    except Exception as e:  # noqa: BLE001 - reported as a failed run
                        res = RunnerResult(None, f"{type(e).__name__}: {e}")
                    futures.append(RunnerFuture(f_done=lambda: True, f_result=lambda r=res: r))
                return futures

        self.builder, self.runner = _Builder(), _Runner()

    @staticmethod
    def build_module(mod, target):
        """``mod`` (TIR) compiled as MetaSchedule's LocalBuilder compiles it."""
        from tvm.s_tir.meta_schedule.builder.local_builder import default_build

        return default_build(mod, target, None)

    def time_module(self, rt, args_info) -> list[float]:
        """Seconds per run of a built kernel on random arguments, timed in the device thread."""
        import tvm
        from tvm.s_tir.meta_schedule.runner.local_runner import default_alloc_argument

        def work():
            dev = tvm.cpu(0)
            args = default_alloc_argument(dev, [a.as_json() for a in args_info], 1)[0]
            f = rt.time_evaluator(rt.entry_name, dev, number=self.number, repeat=1, min_repeat_ms=self.min_repeat_ms)
            return [float(x) for x in f(*args).results]

        return self._pool.submit(work).result()

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
    import sys
    import types

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
