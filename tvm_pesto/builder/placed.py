"""Build a placed module: one compiled module per device, run together by the executor."""
from __future__ import annotations

import time

import numpy as np
import tvm
from tvm import relax

from ..errors import BuildError, ExecutionError
from ..run.executor import Executor, to_numpy
from ..run.program import read_program, split_by_device


def compile_for(mod: tvm.IRModule, target: dict, what: str, database=None):
    """``tvm.compile`` with the target's default pipeline (so ops fuse); errors explained.

    CUDA targets go through :func:`tvm_pesto.backends.gpu.tvm_cuda.compile_cuda` (dlight
    GPU schedules, a MetaSchedule database when given).
    """
    if target.get("kind") == "cuda":
        from ..backends.gpu import tvm_cuda

        return tvm_cuda.compile_cuda(mod, target, database=database, what=what)
    tgt = tvm.target.Target(target)
    try:
        return tvm.compile(mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    except Exception as e:  # noqa: BLE001 - TVM raises many types; explain at our boundary
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise BuildError(f"TVM failed to build {what} for target {target}: {first}") from e


class PlacedModule:
    """A model split across devices, ready to run.

    Call it like a function on numpy arrays (returns numpy) or TVM tensors (returns TVM
    tensors). ``plan``, ``problem`` and ``sim`` say what was decided and predicted;
    ``placed_mod`` is the rewritten IRModule, ``device_mods`` the per-device modules.
    """

    def __init__(self, placed_mod, cluster, plan=None, problem=None, sim=None, analysis=None, progress=None):
        self.placed_mod = placed_mod
        self.cluster = cluster
        self.plan = plan
        self.problem = problem
        self.sim = sim
        self.analysis = analysis
        self.device_mods = split_by_device(placed_mod)
        self.program = read_program(placed_mod)
        self.executables = {}
        self.vms = {}
        for k, (d, m) in enumerate(self.device_mods.items()):
            dev = cluster.devices[d]
            self.executables[d] = compile_for(m, dev.target, f"the module of device {d} ({dev.name})")
            if dev.present:
                if dev.kind == "gpu":
                    from ..backends.gpu import tvm_cuda

                    tvm_cuda.use_available_jit()
                self.vms[d] = relax.VirtualMachine(self.executables[d], dev.tvm_device())
            if progress:
                progress(k + 1, len(self.device_mods))
        self._executor = None
        self.last_trace = []

    @property
    def devices_used(self) -> list[int]:
        return sorted(self.device_mods)

    def _exec(self) -> Executor:
        if self._executor is None:
            missing = [d for d in self.device_mods if d not in self.vms]
            if missing:
                raise ExecutionError(f"devices {missing} ({[self.cluster.devices[d].name for d in missing]}) are not "
                                     "on this machine; the plan can be simulated and exported, not run here")
            self._executor = Executor(self.program, self.vms, self.cluster)
        return self._executor

    def _inputs(self, args):
        if len(args) != len(self.program.inputs):
            raise ExecutionError(f"the module takes {len(self.program.inputs)} inputs, got {len(args)}")
        dev0 = self.cluster.devices[0].tvm_device()
        out = []
        for a in args:
            if isinstance(a, tvm.runtime.Tensor):
                out.append(a if a.device == dev0 else a.copyto(dev0))
            else:
                out.append(tvm.runtime.tensor(np.ascontiguousarray(a), device=dev0))
        return out

    def __call__(self, *args):
        as_numpy = any(isinstance(a, np.ndarray) for a in args)
        res = self._exec().run(self._inputs(args))
        return to_numpy(res) if as_numpy else res

    def run_traced(self, *args):
        trace: list = []
        res = self._exec().run(self._inputs(args), trace=trace)
        self.last_trace = trace
        return res, trace

    def benchmark(self, *args, repeat: int = 20, warmup: int = 3) -> dict:
        """Wall-clock seconds per run (median, min, max over ``repeat`` runs)."""
        ex = self._exec()
        inputs = self._inputs(args)
        for _ in range(warmup):
            ex.run(inputs)
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            ex.run(inputs)
            times.append(time.perf_counter() - t)
        return {"median_s": float(np.median(times)), "min_s": float(np.min(times)),
                "max_s": float(np.max(times)), "repeat": repeat}

    def close(self):
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
