"""``tvm-pesto bench peers``: tvm-pesto against the libraries a user would run instead.

``tvm_pesto/cli/bench.py`` adds this command to the ``bench`` group.
"""
from __future__ import annotations

import click

from ..bench.backends import quiet_openmp
from ..errors import PestoError
from ..jsonio import write_json, write_text
from .progress import console


def _models(zoo_names, sizes, outside: bool):
    """``[(label, make)]``: zoo models at each size, then the models of ``zoo.outside``."""
    # lazy: loads TVM's compiler and PyTorch; the CLI imports a verb's code when the verb runs
    from .. import zoo
    from ..frontend import from_torch
    from ..zoo import outside

    out = []
    for size in sizes:
        for name in zoo_names:
            out.append((f"{name}/{size}", lambda n=name, s=size: _zoo(zoo.load(n, s))))
        if outside:
            for name in outside.list_models():
                def make(n=name, s=size):
                    model, inputs = outside.build(n, s)
                    return model, inputs, from_torch(model, inputs, name=f"{n}/{s}")
                out.append((f"{name}/{size}", make))
    return out


def _zoo(m):
    return m.torch_model, m.example_inputs, m.mod


@click.command("peers")
@click.option("--model", "models", multiple=True,
              help="zoo or zoo.outside model name (repeatable; default: every zoo model and every outside model)")
@click.option("--size", "sizes", multiple=True, type=click.Choice(["small", "full"]),
              help="model size (repeatable; default: small)")
@click.option("--cores", default=None, type=int, help="threads for the peers and N of cpu:N (default: this machine's)")
@click.option("--costs", default="auto", show_default=True, help="cost source of tvm-pesto's build")
@click.option("--torch-compile/--no-torch-compile", default=True, show_default=True,
              help="include torch.compile (Inductor compiles each model for tens of seconds)")
@click.option("--rounds", default=3, show_default=True, help="timed blocks per variant (order rotated)")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
@click.option("--md", "md_path", default=None, help="write the table as markdown here")
def peers(models, sizes, cores, costs, torch_compile, rounds, json_path, md_path):
    """Each model in ONNX Runtime (sequential, parallel, one thread), PyTorch, OpenVINO,
    torch.compile and tvm-pesto (cpu:N and cpu:1), in one process, timed in blocks."""
    quiet_openmp()  # before anything imports torch
    # lazy: loads TVM's compiler and PyTorch; the CLI imports a verb's code when the verb runs
    from .. import zoo
    from ..bench.peers import bench_peers, markdown
    from ..zoo import outside

    known_zoo, known_out = zoo.list_models(), outside.list_models()
    unknown = [m for m in models if m not in known_zoo and m not in known_out]
    if unknown:
        raise PestoError(f"unknown model(s) {', '.join(unknown)}; valid: {', '.join(known_zoo + known_out)}")
    zoo_names = [m for m in models if m in known_zoo] if models else known_zoo
    out_names = [m for m in models if m in known_out] if models else known_out
    todo = [(label, make) for label, make in _models(zoo_names, sizes or ("small",), bool(out_names))
            if label.split("/")[0] in zoo_names + out_names]
    res = bench_peers(todo, cores=cores, torch_compile=torch_compile, build_options={"costs": costs}, rounds=rounds,
                      progress=lambda m: console.print(f"  {m}"))
    res["command"] = click.get_current_context().command_path
    text = markdown(res)
    click.echo(text)
    if json_path:
        write_json(json_path, res)
        console.print(f"JSON: {json_path}")
    if md_path:
        write_text(md_path, text)
        console.print(f"markdown: {md_path}")


__all__ = ["peers"]
