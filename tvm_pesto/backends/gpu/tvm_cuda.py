"""TVM-native CUDA: per-device modules compiled for a CUDA target with dlight GPU schedules.

``relax.get_default_pipeline(cuda target)`` in TVM 0.27 legalizes, fuses and applies the
dlight GPU rules (Matmul, GEMV, Reduction, GeneralReduction, Fallback). :func:`cuda_pipeline`
is that pipeline with an optional MetaSchedule database applied before dlight, so tuned
kernels win and the rest still get a default schedule.

On a machine without a GPU, TVM generates CUDA source and keeps it in the module
(``export_library`` works); the kernels are compiled when the library is loaded on a GPU
machine (NVRTC, or nvcc with ``TVM_CUDA_COMPILE_MODE=nvcc``). :func:`nvcc_check`
compiles the generated source with nvcc here, so a codegen problem shows up without a GPU.

Examples
--------
>>> from tvm_pesto.backends.gpu.tvm_cuda import cuda_target
>>> cuda_target("A100").export()["arch"]
'sm_80'
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

import tvm
from tvm import relax

from ...errors import BuildError
from ..base import Backend, output_types
from ...cluster import gpu_probe as probe

#: GPU model -> CUDA architecture (the cluster presets' models).
ARCHS = {"V100": "sm_70", "T4": "sm_75", "A100": "sm_80", "A10": "sm_86", "L4": "sm_89",
         "H100": "sm_90", "H200": "sm_90"}


def cuda_target(spec) -> tvm.target.Target:
    """A CUDA ``Target`` from a device, a target dict, an arch (``"sm_80"``) or a GPU model.

    Parameters
    ----------
    spec : Device | dict | str | tvm.target.Target

    Examples
    --------
    >>> cuda_target({"kind": "cuda", "arch": "sm_90"}).export()["arch"]
    'sm_90'
    >>> cuda_target("sm_70").kind.name
    'cuda'
    """
    if isinstance(spec, tvm.target.Target):
        tgt = spec
    elif isinstance(spec, dict):
        tgt = tvm.target.Target(dict(spec))
    elif isinstance(spec, str):
        if spec.startswith("sm_"):
            tgt = tvm.target.Target({"kind": "cuda", "arch": spec})
        elif spec.upper() in ARCHS:
            tgt = tvm.target.Target({"kind": "cuda", "arch": ARCHS[spec.upper()]})
        else:
            raise BuildError(f"unknown CUDA target {spec!r}; give an arch like 'sm_80', a GPU model "
                             f"({', '.join(ARCHS)}) or a target dict")
    elif hasattr(spec, "target"):
        return cuda_target(spec.target)
    else:
        raise BuildError(f"cannot make a CUDA target from a {type(spec).__name__}")
    if tgt.kind.name != "cuda":
        raise BuildError(f"target {tgt} is not a CUDA target")
    return tgt


def _check_database(database):
    if database is None or not isinstance(database, (str, os.PathLike)):
        return database
    d = Path(database)
    need = ("database_workload.json", "database_tuning_record.json")
    if not d.is_dir() or not all((d / n).exists() for n in need):
        raise BuildError(f"no MetaSchedule database at {d}: expected a folder with {need[0]} and {need[1]} "
                         "(tune with tvm.s_tir.meta_schedule.tune_tir / relax_integration.tune_relax on a GPU)")
    return str(d)


def cuda_pipeline(target, database=None) -> tvm.transform.Pass:
    """TVM 0.27's CUDA pipeline, with ``MetaScheduleApplyDatabase`` before dlight when given.

    Parameters
    ----------
    target : tvm.target.Target
        A CUDA target.
    database : str | os.PathLike | tvm.s_tir.meta_schedule.Database, optional
        A MetaSchedule work dir (``database_workload.json`` + ``database_tuning_record.json``)
        or database object.

    Examples
    --------
    >>> p = cuda_pipeline(cuda_target("sm_80"))
    >>> isinstance(p, tvm.transform.Pass)
    True
    """
    from tvm.relax.backend.cuda import pipeline as cp

    database = _check_database(database)
    if database is None:
        return relax.get_default_pipeline(target)

    def apply_db():
        # MetaScheduleApplyDatabase reads the current target when it is created.
        if isinstance(database, str):
            return relax.transform.MetaScheduleApplyDatabase(work_dir=database)

        @tvm.transform.module_pass(opt_level=0, name="PestoApplyDatabase")
        def _apply(mod, _ctx):
            with database:
                return relax.transform.MetaScheduleApplyDatabase()(mod)
        return _apply

    @tvm.transform.module_pass(opt_level=0, name="PestoCudaPipeline")
    def _pipeline(mod, _ctx):
        with target:
            legalize = cp.legalize_passes(target)
            # legalize_passes ends with dlight: tuned kernels go in just before it, and
            # dlight skips the functions the database scheduled.
            passes = (cp.library_dispatch_passes(target) + legalize[:-1] + [apply_db(), legalize[-1]]
                      + cp.dataflow_lower_passes(target) + cp.finalize_passes(target))
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def compile_cuda(mod: tvm.IRModule, target, database=None, what: str = "module", cuda_graph: bool | None = None):
    """Compile a Relax module for a CUDA target (no GPU needed).

    Parameters
    ----------
    mod : tvm.IRModule
    target : see :func:`cuda_target`
    database : optional MetaSchedule database (see :func:`cuda_pipeline`)
    what : str
        Named in error messages.
    cuda_graph : bool, optional
        Capture the static parts of each function into CUDA graphs on the first call and replay
        them after (TVM's ``relax.backend.use_cuda_graph``): one launch instead of one per
        kernel; on an H200 the small zoo models' ``main`` took 4-23 % less time (``docs/gpu.md``).
        Default: the enclosing PassContext's ``relax.backend.use_cuda_graph`` when it sets one
        (so ``tvm_pesto.build`` inside ``PassContext(config={"relax.backend.use_cuda_graph":
        False})`` captures nothing), else True.

    Returns
    -------
    relax.VMExecutable

    Raises
    ------
    BuildError
        With TVM's last error line and the target.

    Examples
    --------
    Not run here: compiling needs the CUDA toolkit (nvcc, or NVRTC from the ``gpu`` extra).

    >>> from tvm_pesto.candidates.examples import tiny_mlp   # doctest: +SKIP
    >>> ex = compile_cuda(tiny_mlp()[0], "sm_80")            # doctest: +SKIP
    >>> ex.export_library("model.so")                        # doctest: +SKIP
    """
    tgt = cuda_target(target)
    pipeline = cuda_pipeline(tgt, database)
    outer = tvm.transform.PassContext.current()
    config = {str(k): v for k, v in outer.config.items()}
    if cuda_graph is None:
        cuda_graph = bool(config.get("relax.backend.use_cuda_graph", True))
    config["relax.backend.use_cuda_graph"] = bool(cuda_graph)
    try:
        with tvm.transform.PassContext(opt_level=outer.opt_level, config=config,
                                       required_pass=list(outer.required_pass),
                                       disabled_pass=list(outer.disabled_pass)):
            return tvm.compile(mod, target=tgt, relax_pipeline=pipeline)
    except Exception as e:  # noqa: BLE001 - TVM raises many types; explain at our boundary
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise BuildError(f"TVM failed to build {what} for {tgt.export().get('arch', 'cuda')}: {first}") from e


def cuda_sources(ex) -> list[str]:
    """The CUDA C++ source of every device module inside an executable.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp          # CUDA toolkit  # doctest: +SKIP
    >>> srcs = cuda_sources(compile_cuda(tiny_mlp()[0], "sm_80"))   # doctest: +SKIP
    >>> len(srcs)                                                   # doctest: +SKIP
    1
    """
    out = []

    def walk(m):
        if m.kind == "cuda":
            out.append(m.inspect_source())
        for i in m.imports:
            walk(i)

    walk(ex.mod)
    return out


def export_cuda(ex, path) -> Path:
    """``export_library`` to ``path`` (a ``.so``); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        ex.export_library(str(path))
    except Exception as e:  # noqa: BLE001
        raise BuildError(f"export_library to {path} failed: {str(e).strip().splitlines()[-1]}") from e
    return path


def nvcc_check(source: str, arch: str, workdir=None, timeout: float = 300) -> Path:
    """Compile CUDA source to a cubin with nvcc; raises :class:`BuildError` with nvcc's
    message when it fails or when nvcc cannot target ``arch`` (CUDA 13 dropped sm_70).

    Examples
    --------
    >>> nvcc_check("__global__ void k(float* x) { x[0] = 1.f; }", "sm_80")   # needs nvcc  # doctest: +SKIP
    PosixPath('.../pesto-nvcc-.../kernels_sm_80.cubin')
    """
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BuildError("nvcc is not on PATH; install the CUDA toolkit to check generated CUDA without a GPU")
    archs = probe.nvcc_archs()
    if archs and arch not in archs:
        raise BuildError(f"this nvcc cannot compile for {arch} (it supports {', '.join(archs)}); "
                         "CUDA 13 removed Volta (sm_70): use a CUDA 12 toolkit for V100")
    d = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="pesto-nvcc-"))
    d.mkdir(parents=True, exist_ok=True)
    src, out = d / f"kernels_{arch}.cu", d / f"kernels_{arch}.cubin"
    src.write_text(source)
    r = subprocess.run([nvcc, "--cubin", f"-arch={arch}", "-O3", "-w", "-o", str(out), str(src)],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
        raise BuildError(f"nvcc could not compile TVM's CUDA for {arch}:\n{tail}")
    return out


def use_available_jit() -> str | None:
    """Make TVM able to compile kernels on this GPU machine: keeps NVRTC when
    ``cuda-bindings`` is installed, else switches TVM to nvcc (``TVM_CUDA_COMPILE_MODE``).
    Returns the mode in use, or ``None`` when neither is there."""
    mode, _ = probe.jit_compiler()
    if mode is None and shutil.which("nvcc"):
        os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
        probe.jit_compiler.cache_clear()
        mode, _ = probe.jit_compiler()
    return mode


class TvmCudaBackend(Backend):
    """TVM-native kernels on a CUDA device (the GPU fallback that covers every op).

    Its candidates are TVM's fusion groups (the candidate generator treats backends whose
    name starts with ``tvm`` that way), so :meth:`patterns` is empty.
    """

    name = "tvm-cuda"
    build_s_guess = (0.2, 0.05)  # one TVM CUDA compile per unit
    device_kinds = ("gpu",)
    graph_level = False
    max_ops = 8
    tvm_groups = True

    def __init__(self, database=None) -> None:
        super().__init__()
        self.database = database

    def patterns(self) -> list:
        return []

    def supports_op(self, call) -> bool:
        return isinstance(call, relax.Call)

    def available(self) -> tuple[bool, str]:
        mode, why = probe.jit_compiler()
        if mode is None and probe.tvm_cuda_runtime()[0]:
            mode = use_available_jit()
            why = "" if mode else why
        return probe.combine(probe.tvm_cuda_runtime(), (mode is not None, why))

    def global_name(self, key: str, device) -> str:
        return f"pesto.{self.name}.{key}.gpu{getattr(device, 'index', 0)}"

    def make_callable(self, func: relax.Function, device) -> Callable:
        target = cuda_target(device)
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        ex = compile_cuda(mod, target, self.database, what="a tvm-cuda subgraph")
        dev = tvm.cuda(int(getattr(device, "index", 0)))
        vm = relax.VirtualMachine(ex, dev)
        n_in = len(func.params)
        n_out = len(output_types(func))

        def run(*args):
            res = vm["main"](*args[:n_in])
            outs = list(res) if n_out > 1 else [res]
            for src, dst in zip(outs, args[n_in:]):
                src.copyto(dst)

        return run
