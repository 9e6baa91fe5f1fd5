"""``tvm-pesto bench backends``: Collage-style multi-backend choice, measured on this machine.

``tvm_pesto/cli/bench/__init__.py`` adds this command to the ``bench`` group
(``bench.add_command(backends)``), so no change to ``main.py`` is needed.
"""
from __future__ import annotations

import click

from ...bench.backends import ROUNDS, bench_backends, quiet_openmp
from ...bench.report import noise_line
from ...costs.store.cache import MeasureCache
from ...jsonio import write_json
from ...solve.budget import deterministic_mode
from ..options import deterministic_option
from ..progress import console


@click.command("backends")
@click.option("--model", "models", multiple=True, help="zoo model name or model file (.onnx, .pt2, .py; repeatable; default: every zoo model)")
@click.option("--size", default="small", show_default=True, type=click.Choice(["small", "full"]))
@click.option("--backends", default=None, help="comma-separated backend names (default: every registered one)")
@click.option("--rounds", default=ROUNDS, show_default=True, help="timed blocks per variant (order rotated)")
@click.option("--time-limit", default=30.0, show_default=True, help="joint ILP time limit (s)")
@click.option("--select", "select_by", default="measured", show_default=True,
              type=click.Choice(["measured", "predicted"]),
              help="how joint_s picks between the 1- and 2-device joint results")
@click.option("--cache", "cache_path", default=None, help="measurement log (JSON lines); default ~/.cache/tvm-pesto")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
@deterministic_option(True)
def backends(models, size, backends, rounds, time_limit, select_by, cache_path, json_path, deterministic):
    """Each backend alone vs Collage's DP vs the joint backend/placement ILP vs tvm_pesto.build,
    for every zoo model, timed in blocks.

    The joint solves run with work budgets unless --wall-clock (the JSON says which)."""
    quiet_openmp()  # before anything imports torch
    names = [b.strip() for b in backends.split(",")] if backends else None
    cache = MeasureCache(cache_path) if cache_path else MeasureCache()
    if cache.skipped:
        console.print(f"[yellow]measurement log {cache.path}: skipped {len(cache.skipped)} corrupted line(s)[/]")
    with deterministic_mode(deterministic):
        res = bench_backends(list(models) or None, size=size, backends=names, cache=cache, rounds=rounds,
                             time_limit_s=time_limit, progress=lambda m: console.print(f"  {m}"), select_by=select_by)
    res["cache_skipped_lines"] = [n for n, _ in cache.skipped]
    res["deterministic"] = deterministic
    _print(res)
    if json_path:
        write_json(json_path, res, schema="bench-backends")


def _print(res: dict) -> None:
    ms = lambda s: f"{s * 1e3:9.3f}" if s is not None else "      n/a"  # noqa: E731
    x = lambda r: f"{r:.3f}x" if r else "n/a"  # noqa: E731
    models = res["models"]
    singles = sorted({b for m in models.values() for b in m["single_s"]})
    head = "".join(f"{b[:11]:>11s}" for b in singles)
    console.print(f"[bold]{'model':14s}{head}{'dp':>11s}{'joint':>11s}{'build':>11s}{'dp':>8s}{'joint':>8s}"
                  f"{'build':>8s}{'err':>10s}{'cands':>7s}{'meas':>6s}[/]  (ms; speedups over the best single backend)")
    for n, m in models.items():
        cols = "".join(f"{ms(m['single_s'].get(b)):>11s}" for b in singles)
        console.print(f"{n:14s}{cols}{ms(m['collage_dp_s']):>11s}{ms(m['joint_s']):>11s}{ms(m.get('pesto_s')):>11s}"
                      f"{x(m.get('collage_dp_speedup_vs_best_single')):>8s}{x(m.get('speedup_vs_best_single')):>8s}"
                      f"{x(m.get('pesto_speedup_vs_best_single')):>8s}{m['max_abs_err']:10.2g}{m['candidates']:7d}"
                      f"{m['measured_this_run']:6d}  (joint: {m['joint_choice']}; build kept "
                      f"{m.get('pesto', {}).get('chosen') or m.get('pesto', {}).get('error', 'n/a')})")
    console.print("[bold]ceilings[/] (from the measured costs, over the best single backend's prediction): the mix "
                  "with every library call's fixed cost free; any plan with free communication between devices")
    for n, m in models.items():
        c = m.get("ceiling")
        if c:
            console.print(f"  {n:14s} mix {x(c['mix'])} as solved, {x(c['mix_free_boundaries'])} with free boundaries "
                          f"{c['free_mix']}; joint at most {x(c['joint_free_communication'])} with free communication "
                          f"(its plan: devices {c['joint_free_devices']}, {c['joint_free_status']})")
    for n, e in res.get("errors", {}).items():
        console.print(f"[red]{n}: {e}[/]")
    g, w = res.get("geomean_speedup_vs_best_single"), res.get("worst_ratio_vs_best_single")
    if g is not None:
        console.print(f"geomean speedup over the best single backend: Collage-DP alone "
                      f"{x(res.get('geomean_speedup_collage_dp_vs_best_single'))}; joint {g:.3f}x (worst "
                      f"joint/best-single ratio {w:.3f}; with the simulator's 1-vs-2-device choice "
                      f"{x(res.get('geomean_speedup_predicted_choice'))}); tvm_pesto.build "
                      f"{x(res.get('geomean_speedup_pesto_vs_best_single'))} (worst "
                      f"{x(res.get('worst_speedup_pesto_vs_best_single'))})")
    if res.get("geomean_ceiling_mix_free_boundaries") is not None:
        console.print(f"geomean ceilings: mix with free boundaries {x(res['geomean_ceiling_mix_free_boundaries'])}, "
                      f"joint with free communication {x(res.get('geomean_ceiling_joint_free_communication'))}")
    if res.get("noise"):
        console.print(noise_line(res["noise"]))
    un = {k: v for m in models.values() for k, v in m.get("unavailable", {}).items()}
    for k, v in un.items():
        console.print(f"  backend {k} unavailable: {v}")
