#!/usr/bin/env python
"""Device check for the GPU backends: build here, run on the lent GPU machine, fail loudly.

The lent GPU machine (one H200) has no TVM, no package registry, and takes at most 64 MiB per
call, working tree included. So the check has two halves::

    python tests/gpu/device_check.py --prepare DIR   # here: build the folder (with the working
                                                     # tree <= 62 MiB, what a device call carries)
    python tests/gpu/device_check.py --run DIR       # GPU machine: run it, write the JSON log
    python tests/gpu/device_check.py --dry-run       # here: --prepare (a temp folder unless
                                                     # --prepare DIR), then its CPU twins runtime-only
    python tests/gpu/device_check.py                 # a machine with TVM and a GPU: both halves

``--prepare`` (``tests/gpu/prepare.py``) compiles each model (small size) for CUDA sm_90 with
TVM and nvcc, exports it and its CPU twin, writes inputs and references, the cuBLAS/cuDNN
plans with their inputs and weights, the mixed module (``--mix``: tvm-pesto's plan for h200, or
every library match) with its units' plans, the runtime-only TVM package, the tvm-ffi and
cudnn-frontend wheels for CPython 3.12, and the runner. Everything that needs no GPU is
checked on the way: compile, export, nvcc, pattern coverage, each plan emulated against TVM,
TensorRT's ONNX regions in ONNX Runtime, the folder's size.

``--run DIR`` needs only the folder (``run_gpu_check.py``, from ``tests/gpu/gpu_runner.py``):
it loads each module with TVM's runtime alone on ``tvm.cuda(0)``, compares with the
references, times ``main``, the fusion groups and the library calls (median of repeats), and
writes the JSON log that a GPU session commits under ``cost_models/``.

Exit status: 0 when every row is ok (or skipped for a documented reason, ``gpu_runner.
SKIP_REASONS``); 1 when any row is mismatch, build_failed, missing_library or crashed; 2 when
the check cannot start (no GPU for ``--run``, an unusable folder). ``docs/gpu.md`` ("Device
check") gives a GPU session's exact commands.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import gpu_runner as runner  # noqa: E402 - stdlib + NumPy only: --run works where TVM is not installed


def run_folder(folder: Path, argv: list, env=None, capture: bool = False):
    """Run the folder's runner; returns (exit status, output or None). A runner killed by a
    signal (a crash inside CUDA, cuBLAS or cuDNN) counts as a failure (1)."""
    script = folder / "run_gpu_check.py"
    if not script.is_file():
        print(f"{folder} has no run_gpu_check.py: build it with --prepare {folder}", file=sys.stderr)
        return 2, None
    r = subprocess.run([sys.executable, str(script), *argv], env=env, capture_output=capture, text=True)
    out = (r.stdout or "") + (r.stderr or "") if capture else None
    if r.returncode < 0:
        print(f"the runner was killed by signal {-r.returncode}; its log holds the rows before the crash",
              file=sys.stderr)
        return 1, out
    return r.returncode, out


def call_size_line(man: dict) -> str:
    """What a device call carrying the prepared folder carries, from its manifest."""
    size, mib = man["call_bytes"], 1 << 20
    if size["total"] is None:
        return f"folder {size['folder'] / mib:.1f} MiB (not a git checkout: the working tree's size is unknown)"
    return (f"a device call carries {size['total'] / mib:.1f} MiB: working tree {size['tree'] / mib:.1f} MiB + "
            f"folder {size['folder'] / mib:.1f} MiB")


def _write_log(path, mode: str, man: dict, rows: list) -> None:
    log = runner.Log(Path(path), mode, man, {"python": sys.version.split()[0]})
    log.data["rows"] = rows
    log.write(final=True)


class CannotStart(Exception):
    """The check cannot start (exit status 2)."""


def _prepare(args, folder: Path, arch: str):
    import prepare as prep  # imports TVM and tvm_pesto: only where the folder is built
    from tvm_pesto.errors import PestoError

    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else list(prep.DEFAULT_MODELS)
    try:
        return prep.prepare(folder, models, arch=arch, wheel_cache=args.wheel_cache,
                            allow_missing_wheels=args.allow_missing_wheels,
                            max_mib=prep.MAX_MIB if args.max_mib is None else args.max_mib, mix=args.mix)
    except (prep.PrepareError, PestoError) as e:  # an unusable folder, no TVM package to copy
        raise CannotStart(str(e)) from e


def twin_rows(folder: Path) -> list:
    """Run the folder's CPU twins runtime-only in a fresh process (``TVM_USE_RUNTIME_LIB=1``,
    ``PYTHONPATH`` the folder's TVM); its rows, or one crashed row saying what went wrong."""
    log = folder / "logs" / "cpu-twins.json"
    if log.exists():
        log.unlink()
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONPATH=str(folder / "runtime"))
    rc, out = run_folder(folder, ["--cpu-twins", "--out", str(log), "--repeat", "2", "--min-repeat-ms", "1"], env=env,
                         capture=True)
    rows = json.loads(log.read_text())["rows"] if log.exists() else []
    if rc not in (0, 1) or not rows:
        bad = runner.Row("*", "cpu-twin")
        bad.add("runtime-only run", "crashed", f"exit status {rc}: {(out or '').strip()[-600:]}")
        rows.append(bad.to_dict())
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Device check for the GPU backends (see the module docstring).")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--run", metavar="DIR", help="GPU machine: run the prepared folder DIR")
    mode.add_argument("--dry-run", action="store_true", help="no GPU: prepare, then check everything a CPU can")
    ap.add_argument("--prepare", metavar="DIR", help="build the folder DIR (with --dry-run: keep it there)")
    ap.add_argument("--models", default="", help="comma-separated zoo models (default: prepare.DEFAULT_MODELS)")
    ap.add_argument("--arch", default="sm_90", help="CUDA architecture of the GPU machine (H200: sm_90)")
    ap.add_argument("--mix", default="plan", choices=("plan", "library"),
                    help="--prepare: the mixed module's cover: tvm-pesto's plan for h200 with TVM, cuBLAS and cuDNN "
                         "(default), or every cuBLAS / cuDNN match")
    ap.add_argument("--out", default=None, help="JSON log (--run: default DIR/logs/gpu-check.json; no mode: "
                    "cost_models/gpu-check-<gpu>.json)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--min-repeat-ms", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=300.0, help="--run: stop timing after this many seconds")
    ap.add_argument("--max-mib", type=float, default=None, help="--prepare: limit on what one device call carries, "
                    "the working tree plus the folder (default prepare.MAX_MIB, at most 64)")
    ap.add_argument("--wheel-cache", default=None, help="--prepare: wheel cache (default ~/.cache/tvm-pesto/wheels)")
    ap.add_argument("--allow-missing-wheels", action="store_true",
                    help="--prepare: go on when a wheel cannot be downloaded (the row says registry-unreachable)")
    args = ap.parse_args(argv)
    try:
        return _main(args)
    except CannotStart as e:
        print(f"cannot start: {e}", file=sys.stderr)
        return 2


def _main(args) -> int:
    timing = ["--repeat", str(args.repeat), "--min-repeat-ms", str(args.min_repeat_ms), "--budget-s", str(args.budget_s)]
    if args.run:
        folder = Path(args.run).resolve()
        out = args.out or str(folder / "logs" / "gpu-check.json")
        models = ["--models", args.models] if args.models else []
        return run_folder(folder, ["--out", out, *timing, *models])[0]
    if args.dry_run or args.prepare:
        folder = Path(args.prepare or tempfile.mkdtemp(prefix="pesto-gpucheck-")).resolve()
        try:
            man, rows = _prepare(args, folder, args.arch)
            if args.dry_run:
                rows += twin_rows(folder)
            runner.print_table(rows)
            kept = f"folder: {folder}" if args.prepare else "folder removed (--prepare DIR keeps it)"
            print(f"\n{kept}; {call_size_line(man)}")
            if args.out:
                _write_log(args.out, "dry-run" if args.dry_run else "prepare", man, rows)
        finally:
            if not args.prepare:
                shutil.rmtree(folder, ignore_errors=True)
        return runner.exit_code(rows)
    from tvm_pesto.cluster import gpu_probe

    ok, why = gpu_probe.tvm_cuda_runtime()
    if not ok:
        print(f"no usable GPU here ({why}).\nHere: --dry-run, or --prepare DIR and then --run DIR on the GPU machine.")
        return 2
    import re

    import tvm

    dev = tvm.cuda(0)
    arch = "sm_" + str(dev.compute_version).replace(".", "")
    slug = re.sub(r"[^a-z0-9]+", "-", str(dev.device_name).lower()).strip("-")
    out = args.out or str(ROOT / "cost_models" / f"gpu-check-{slug}.json")
    folder = Path(tempfile.mkdtemp(prefix="pesto-gpucheck-"))
    try:
        man, rows = _prepare(args, folder, arch)
        runner.print_table(rows)
        if runner.exit_code(rows):
            print("\n--prepare failed (above); not running")
            return 1
        return run_folder(folder, ["--out", out, *timing])[0]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
