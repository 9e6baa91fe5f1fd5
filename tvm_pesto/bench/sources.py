"""Where ``bench peers`` gets a model, and how one model runs in a process of its own.

A :class:`ModelSource` names a model (a zoo model, a ``zoo.outside`` model, a corpus
architecture of :mod:`tvm_pesto.zoo.corpus`, or a model file) and loads it; being a small
record, it crosses into a child process. :func:`run_isolated` benches one source in a
spawned process: a model that fails to import, export or build, that crashes the process
(a segfault deep inside a library) or that runs past its time is a row with its error,
and the run goes on; each model's build memory is its own process's.

Examples
--------
>>> from tvm_pesto.bench.sources import ModelSource, failed_row
>>> ModelSource("corpus", "resnet18", "full").label
'resnet18/full'
>>> failed_row("timed out after 5 s")["error"]
'timed out after 5 s'
"""
from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass

import torch

from .. import zoo
from ..errors import GraphError, error_line
from ..frontend import from_torch
from ..models import load_model
from ..zoo import corpus, outside
from .backends import quiet_openmp

KINDS = ("zoo", "outside", "corpus", "file")


@dataclass(frozen=True)
class ModelSource:
    """One model to bench: ``kind`` (one of :data:`KINDS`), ``name`` (a model name, or the
    file's path) and ``size`` (``small`` or ``full``; a file has the size it was saved at)."""

    kind: str
    name: str
    size: str = "small"

    @property
    def label(self) -> str:
        if self.kind == "file":
            return os.path.basename(self.name)
        return f"{self.name}/{self.size}"

    def load(self):
        """``(torch_model or None, inputs, mod, onnx_path or None)``.

        Raises
        ------
        GraphError, UnsupportedModuleError
            The model cannot be made or imported (the message names it).
        """
        if self.kind == "zoo":
            m = zoo.load(self.name, self.size)
            return m.torch_model, tuple(m.example_inputs), m.mod, None
        if self.kind == "outside":
            model, inputs = outside.build(self.name, self.size)
        elif self.kind == "corpus":
            model, inputs = corpus.load(self.name, self.size)
        elif self.kind == "file":
            return _load_file(self.name)
        else:
            raise GraphError(f"unknown model source kind {self.kind!r}; use one of {', '.join(KINDS)}")
        return model, tuple(inputs), from_torch(model, inputs, name=self.label), None


def _load_file(path: str):
    m = load_model(path)
    model = None
    if path.endswith(".pt2"):
        model = torch.export.load(path).module()
        # its graph is fixed as exported (in eval mode); torch's module of it refuses train() and
        # eval(), which the peers' ONNX export calls: the plain module's flag setters serve
        for name in ("train", "eval"):
            model.__dict__.pop(name, None)
    return model, tuple(m.example_inputs), m.mod, path if path.endswith(".onnx") else None


def failed_row(error: str) -> dict:
    """The row of a model that has no times: every figure None, ``error`` why."""
    return {"variants": {}, "error": error, "best_peer": None, "ratio_vs_best_peer": None, "best_peer_all": None,
            "ratio_vs_best_peer_all": None, "build_s": None, "peak_rss_mb": None, "max_abs_err": None}


def bench_source(load, bench) -> dict:
    """``bench(model, inputs, mod, onnx_path) -> row`` on what ``load()`` returns (as
    :meth:`ModelSource.load`), in this process; a model that cannot be loaded is a
    :func:`failed_row`."""
    try:
        model, inputs, mod, onnx_path = load()
    except Exception as e:  # noqa: BLE001 - the row says why, the benchmark goes on
        return failed_row(f"load: {error_line(e)}")
    return bench(model, inputs, mod, onnx_path)


def _child(source: ModelSource, bench, conn) -> None:
    quiet_openmp()  # before the child's first thread pool
    try:
        conn.send(bench_source(source.load, bench))
    except BaseException as e:  # noqa: BLE001 - sent to the parent, which writes the row
        conn.send(failed_row(f"{error_line(e)} ({traceback.extract_tb(e.__traceback__)[-1].name})"))
    finally:
        conn.close()


def run_isolated(source: ModelSource, bench, timeout_s: float) -> dict:
    """:func:`bench_source` in a spawned process (``bench`` must pickle: a module-level
    function or a :func:`functools.partial` of one); the child's row, or a
    :func:`failed_row` when it died or ran past ``timeout_s``."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(source, bench, child), name=f"bench-{source.label}")
    t0 = time.perf_counter()
    proc.start()
    child.close()
    try:
        if parent.poll(timeout_s):
            row = parent.recv()
            proc.join(30)
            return row
    except EOFError:
        pass
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    if time.perf_counter() - t0 >= timeout_s:
        return failed_row(f"timed out after {timeout_s:.0f} s (--model-timeout)")
    return failed_row(f"the process benching the model died (exit code {proc.exitcode})")


__all__ = ["KINDS", "ModelSource", "bench_source", "failed_row", "run_isolated"]
