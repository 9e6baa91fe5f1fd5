"""``tvm-pesto bench peers``: tvm-pesto against the libraries a user would run instead.

``tvm_pesto/cli/bench/__init__.py`` adds this command to the ``bench`` group.
"""
from __future__ import annotations

import json
import sys

import click

from ...bench.backends import quiet_openmp
from ...errors import PestoError
from ...jsonio import write_json, write_text
from ..progress import console


def _sources(zoo_names, out_names, sizes, corpus: str | None, corpus_models) -> list:
    """The :class:`~tvm_pesto.bench.sources.ModelSource` of every model asked for."""
    # lazy: loads PyTorch and timm only when a corpus is asked for
    from ...bench.sources import ModelSource

    if corpus is not None:
        if corpus != "timm":
            # lazy: loads PyTorch; the CLI imports a verb's code when the verb runs
            from ...zoo.corpus import model_files

            return [ModelSource("file", path) for path in model_files(corpus)]
        # lazy: as above
        from ...zoo.corpus import CORPUS

        unknown = [m for m in corpus_models if m not in CORPUS]
        if unknown:
            raise PestoError(f"unknown corpus model(s) {', '.join(unknown)}; the timm corpus: {', '.join(CORPUS)}")
        return [ModelSource("corpus", name, size) for size in sizes for name in (corpus_models or CORPUS)]
    return [ModelSource(kind, name, size) for size in sizes
            for kind, names in (("zoo", zoo_names), ("outside", out_names)) for name in names]


def _resumable(path: str, about: dict, cores: int | None) -> dict:
    """The earlier run at ``path`` (a ``--json`` of ``bench peers``, stopped or complete), when
    it can be continued by this one: the same CPU, cores, corpus and measurement cache.

    Raises
    ------
    PestoError
        When the file cannot be read as such a run, or it was made on another machine or with
        other settings (the message names which; the fix is a run of its own, without ``--resume``).
    """
    # lazy: the benchmark's machine facts, read when a run is resumed
    from ...bench.report import machine_info

    try:
        with open(path) as f:
            earlier = json.load(f)
        models, command = earlier["models"], earlier["command"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PestoError(f"--resume {path}: not the JSON of a bench peers run ({type(e).__name__}: {e}); give the "
                         "file an earlier run wrote with --json") from e
    if not isinstance(models, dict) or not isinstance(command, str):
        raise PestoError(f"--resume {path}: its models or command are not those of a bench peers run; give the file "
                         "an earlier run wrote with --json")
    here = machine_info()
    want = {"CPU": (earlier.get("machine") or {}).get("cpu_id"), "cores": earlier.get("cores"),
            "corpus": earlier.get("corpus"), "measurement cache": earlier.get("measurement_cache")}
    have = {"CPU": here.get("cpu_id"), "cores": int(cores or here["nproc"]), "corpus": about["corpus"],
            "measurement cache": about["measurement_cache"]}
    differ = [f"{k} {want[k]} there, {have[k]} here" for k in want if want[k] != have[k]]
    if differ:
        raise PestoError(f"--resume {path}: that run cannot be continued by this one ({'; '.join(differ)}); run "
                         "without --resume, or with the settings and on the machine of that run")
    return earlier


@click.command("peers")
@click.option("--model", "models", multiple=True,
              help="zoo or zoo.outside model name, or with --corpus timm a corpus model (repeatable; default: all)")
@click.option("--size", "sizes", multiple=True, type=click.Choice(["small", "full"]),
              help="model size (repeatable; default: small)")
@click.option("--corpus", default=None, metavar="timm|DIR",
              help="bench a corpus instead of the zoo: 'timm' (timm and torchvision architectures, random weights; "
                   "needs timm and torchvision) or a folder of .onnx / .pt2 files")
@click.option("--model-timeout", "model_timeout", default=None, type=float,
              help="bench each model in a process of its own that may run this many seconds (default with "
                   "--corpus: 1800); a crash or a timeout is the model's row, the run goes on")
@click.option("--extra-builds/--no-extra-builds", default=None,
              help="also build on cpu:1 and with openvino-bf16 named (default: on for the zoo, off with --corpus)")
@click.option("--cores", default=None, type=int, help="threads for the peers and N of cpu:N (default: this machine's)")
@click.option("--costs", default="auto", show_default=True, help="cost source of tvm-pesto's build")
@click.option("--torch-compile/--no-torch-compile", default=True, show_default=True,
              help="include torch.compile (Inductor compiles each model for tens of seconds)")
@click.option("--rounds", default=3, show_default=True, help="timed blocks per variant (order rotated)")
@click.option("--warm-cache", is_flag=True, help="build with the shared measurement cache (~/.cache/tvm-pesto), "
              "so a model built before is a warm build [default: each model measures from scratch, as a user's "
              "first build does; the machine's one-time fits are kept]")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
@click.option("--resume", "resume_path", default=None, metavar="JSON",
              help="an earlier run's --json (stopped or complete) on this machine: its models are kept, not run "
                   "again, and the result holds both")
@click.option("--md", "md_path", default=None, help="write the table as markdown here")
def peers(models, sizes, corpus, model_timeout, extra_builds, json_path, md_path, resume_path, **build):
    """Each model in ONNX Runtime (sequential, parallel, one thread), PyTorch, OpenVINO
    (default precision and float32), torch.compile and tvm-pesto (cpu:N and cpu:1), in one
    process, timed in blocks."""
    quiet_openmp()  # before anything imports torch
    # lazy: loads TVM's compiler and PyTorch; the CLI imports a verb's code when the verb runs
    from ... import zoo
    from ...bench.peer_settings import PeerSettings
    from ...bench.peers import bench_peers, markdown
    from ...zoo import outside

    zoo_names, out_names = zoo.list_models(), outside.list_models()
    if corpus is None:
        unknown = [m for m in models if m not in zoo_names and m not in out_names]
        if unknown:
            raise PestoError(f"unknown model(s) {', '.join(unknown)}; valid: {', '.join(zoo_names + out_names)}")
        if models:
            zoo_names, out_names = [m for m in models if m in zoo_names], [m for m in models if m in out_names]
    elif corpus != "timm" and models:
        raise PestoError("--model picks models of the zoo or of --corpus timm; a --corpus folder is benched whole")
    todo = _sources(zoo_names, out_names, sizes or ("small",), corpus, models)
    timeout = model_timeout if model_timeout is not None else (1800.0 if corpus is not None else None)
    about = {"command": " ".join(["tvm-pesto", *sys.argv[1:]]), "corpus": corpus or "zoo",
             "measurement_cache": "warm" if build["warm_cache"] else "cold"}
    earlier = None
    if resume_path:
        earlier = _resumable(resume_path, about, build["cores"])
        about["resumed"] = [*earlier.get("resumed", []), {"command": earlier["command"],
                                                          "date": (earlier.get("machine") or {}).get("date")}]
        todo = [src for src in todo if src.label not in earlier["models"]]
    settings = PeerSettings(cores=build["cores"], torch_compile=build["torch_compile"],
                            build_options={"costs": build["costs"]}, rounds=build["rounds"],
                            extra_builds=corpus is None if extra_builds is None else extra_builds,
                            cold_cache=not build["warm_cache"])
    res = bench_peers(todo, settings, progress=lambda m: console.print(f"  {m}"), model_timeout_s=timeout,
                      earlier=None if earlier is None else earlier["models"],
                      # the checkpoint is not checked against the schema: a long run never stops on it (the final write is)
                      checkpoint=(lambda r: write_json(json_path, {**r, **about, "complete": False})) if json_path
                      else None)
    res.update(about, complete=True)
    text = markdown(res)
    click.echo(text)
    if json_path:
        write_json(json_path, res, schema="bench-peers")
        console.print(f"JSON: {json_path}")
    if md_path:
        write_text(md_path, text)
        console.print(f"markdown: {md_path}")


__all__ = ["peers"]
