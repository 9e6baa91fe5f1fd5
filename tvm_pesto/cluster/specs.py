"""Cluster specifications: presets by name, ``cpu:N`` for this machine, or a JSON file.

Multi-host presets are ``HxNxMODEL[-LINK][-NET]``: ``H`` hosts of ``N`` GPUs each, linked
inside a host by ``LINK`` (``nvlink``, the default, or ``pcie``) and between hosts by
``NET`` (:data:`NETWORKS`: ``100g``, the default, or ``25g``). ``2x8xA100`` is two hosts of
eight A100s on NVSwitch with 100 Gb/s InfiniBand between them.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict

import numpy as np

from ..errors import ClusterError
from .cluster import Cluster, Device, Host
from .host import cpu_identity, l2_geometry

GiB = float(1 << 30)

# name -> (peak fp32 FLOP/s, memory bandwidth B/s, memory bytes, SMs, CUDA arch)
GPU_MODELS = {
    "V100": (15.7e12, 900e9, 32 * GiB, 80, "sm_70"),
    "A100": (19.5e12, 1555e9, 40 * GiB, 108, "sm_80"),
    "H100": (67e12, 3350e9, 80 * GiB, 132, "sm_90"),
    "H200": (67e12, 4800e9, 141 * GiB, 132, "sm_90"),
}
# interconnect -> (latency s, bandwidth B/s per direction, as effective measured figures)
LINKS = {
    "nvlink": (5e-6, 40e9),  # V100 NVLink2 pair; A100 uses NVSwitch below
    "nvswitch": (5e-6, 200e9),
    "pcie": (10e-6, 12e9),
}
# network between hosts -> (latency s, bandwidth B/s per direction): nominal effective figures
# of one NIC (RDMA over 100 Gb/s InfiniBand; TCP over 25 Gb/s Ethernet)
NETWORKS = {
    "100g": (5e-6, 11.5e9),
    "25g": (25e-6, 2.8e9),
}
PRESET_NAMES = ["cpu:N", "NxV100-nvlink", "NxV100-pcie", "NxA100-nvlink", "NxA100-pcie", "h200", "h100",
                "HxNxMODEL[-LINK][-25g|-100g] (e.g. 2x8xA100)"]


def _gpu_cluster(model: str, count: int, link: str) -> Cluster:
    peak, bw, mem, sms, arch = GPU_MODELS[model]
    devs = [
        Device(name=f"gpu{i}", kind="gpu", target={"kind": "cuda", "arch": arch}, memory_bytes=mem,
               peak_flops=peak, mem_bandwidth=bw, cores=sms, index=i, present=False, model=model)
        for i in range(count)
    ]
    if link == "nvlink" and model in ("A100", "H100", "H200"):
        link = "nvswitch"
    lat, lbw = LINKS[link]
    name = f"{count}x{model}-{link}" if count > 1 else model.lower()
    return Cluster(name, devs, np.full((count, count), lat), np.full((count, count), lbw),
                   {"preset": name, "link": link})


def _multi_host_cluster(hosts: int, per_host: int, model: str, link: str, net: str) -> Cluster:
    """``hosts`` hosts of ``per_host`` GPUs each: ``link`` inside a host, ``net`` between."""
    one = _gpu_cluster(model, per_host, link)
    n = hosts * per_host
    devs = [Device(**{**asdict(one.devices[k % per_host]), "name": f"h{k // per_host}.gpu{k % per_host}",
                      "host": k // per_host}) for k in range(n)]
    nlat, nbw = NETWORKS[net]
    same = np.equal.outer(np.arange(n) // per_host, np.arange(n) // per_host)
    lat = np.where(same, one.latency[0, -1] if per_host > 1 else LINKS[one.meta["link"]][0], nlat)
    bw = np.where(same, one.bandwidth[0, -1] if per_host > 1 else LINKS[one.meta["link"]][1], nbw)
    name = f"{hosts}x{per_host}x{model}-{one.meta['link']}-{net}"
    return Cluster(name, devs, lat, bw, {"preset": name, "link": one.meta["link"], "network": net},
                   [Host(f"host{h}", "", nlat, nbw) for h in range(hosts)])


def cpu_info() -> tuple[int, float, float]:
    """(usable cores, peak FLOP/s per core, memory bytes) of this machine."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    ident = cpu_identity()
    ghz = ident["mhz"] / 1000.0 if ident["mhz"] else 2.5  # no clock reported: assume 2.5 GHz
    lanes = ident["flops_per_cycle"] or 16  # no flags reported: the 16 this estimate always assumed
    mem = 8 * GiB
    try:
        mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    return len(cores), ghz * 1e9 * lanes, mem


def cpu_cluster(n: int) -> Cluster:
    """Split this machine's cores into ``n`` CPU devices, each pinned to its own cores."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if n < 1:
        raise ClusterError(f"cpu:{n} asks for {n} devices; the device count must be at least 1: "
                           f"use cpu:1 .. cpu:{len(cores)}")
    if n > len(cores):
        raise ClusterError(f"cpu:{n} asks for {n} devices but this machine has {len(cores)} usable cores; "
                           f"use cpu:1 .. cpu:{len(cores)}")
    _, per_core, mem = cpu_info()
    l2_sets, l2_ways = l2_geometry(cores[0])
    per = len(cores) // n
    devs = []
    for i in range(n):
        ids = tuple(cores[i * per:(i + 1) * per]) if i < n - 1 else tuple(cores[i * per:])
        devs.append(Device(
            name=f"cpu{i}", kind="cpu", target={"kind": "llvm", "num-cores": len(ids)},
            memory_bytes=mem / n, peak_flops=per_core * len(ids), mem_bandwidth=8e9 * len(ids),
            cores=len(ids), index=i, present=True, cpu_ids=ids, model="host-cpu", cpu_kind=cpu_identity()["kind"],
            l2_sets=l2_sets, l2_ways=l2_ways,
        ))
    # Shared memory: a copy is a memcpy plus a hand-off between worker threads. These are
    # defaults; `tvm-pesto cluster bench` measures them on this machine.
    return Cluster(f"cpu:{n}", devs, np.full((n, n), 30e-6), np.full((n, n), 15e9),
                   {"preset": f"cpu:{n}", "link": "shared-memory"})


def parse_cluster(spec: str) -> Cluster:
    """Build a cluster from a spec string or a JSON file path.

    Accepted: ``cpu:N``, ``NxMODEL-LINK`` (MODEL in V100, A100, H100, H200; LINK in nvlink,
    pcie), ``HxNxMODEL[-LINK][-NET]`` (H hosts of N GPUs; NET in 25g, 100g), a single GPU
    name (``h200``), or a path to a JSON file written by :meth:`Cluster.to_json`.

    Examples
    --------
    >>> parse_cluster("4xV100-pcie").num_devices
    4
    >>> c = parse_cluster("2x8xA100")
    >>> c.name, c.num_hosts, c.devices[8].name, c.devices[8].host
    ('2x8xA100-nvswitch-100g', 2, 'h1.gpu0', 1)
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ClusterError("empty cluster spec; use e.g. 'cpu:2', '2xV100-nvlink' or a JSON file")
    s = spec.strip()
    if s.endswith(".json") or os.path.isfile(s):
        if not os.path.isfile(s):
            raise ClusterError(f"cluster file {s!r} does not exist (working directory {os.getcwd()!r}); check "
                               "the path, or write one with `tvm-pesto cluster show cpu:2 > FILE` and edit it")
        try:
            with open(s) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise ClusterError(f"cluster file {s!r} is not valid JSON ({e}); give a complete cluster JSON file "
                               "as Cluster.to_json writes it (`tvm-pesto cluster show cpu:2` prints one)") from None
        return Cluster.from_dict(data, name=os.path.basename(s))
    m = re.fullmatch(r"cpu:(-?\d+)", s, flags=re.I)
    if m:
        return cpu_cluster(int(m.group(1)))
    m = re.fullmatch(r"(-?\d+)x(-?\d+)x([A-Za-z0-9]+)(?:-(nvlink|pcie))?(?:-(\d+g))?", s, flags=re.I)
    if m:
        hosts, per, model = int(m.group(1)), int(m.group(2)), m.group(3).upper()
        link, net = (m.group(4) or "nvlink").lower(), (m.group(5) or "100g").lower()
        if hosts < 1 or per < 1:
            raise ClusterError(f"{s!r}: the host and device counts must be at least 1; use e.g. 2x8x{model}")
        if model not in GPU_MODELS:
            raise ClusterError(f"{s!r}: unknown GPU model {model!r}; known: {', '.join(GPU_MODELS)}")
        if net not in NETWORKS:
            raise ClusterError(f"{s!r}: unknown network {net!r} between hosts; known: {', '.join(NETWORKS)}")
        return _multi_host_cluster(hosts, per, model, link, net)
    m = re.fullmatch(r"(-?\d+)x([A-Za-z0-9]+)-(nvlink|pcie)", s, flags=re.I)
    if m:
        count, model, link = int(m.group(1)), m.group(2).upper(), m.group(3).lower()
        if count < 1:
            raise ClusterError(f"{s!r}: the device count must be at least 1; use e.g. 1x{model}-{link} "
                               f"or 2x{model}-{link}")
        if model not in GPU_MODELS:
            raise ClusterError(f"{s!r}: unknown GPU model {model!r}; known: {', '.join(GPU_MODELS)}")
        return _gpu_cluster(model, count, link)
    if s.upper() in GPU_MODELS:
        return _gpu_cluster(s.upper(), 1, "nvlink")
    raise ClusterError(f"unknown cluster spec {spec!r}; use one of {', '.join(PRESET_NAMES)} or a JSON file")


def as_cluster(cluster) -> Cluster:
    """``cluster`` itself if it is a :class:`Cluster`, else :func:`parse_cluster` of it.

    Examples
    --------
    >>> as_cluster("cpu:2").name, as_cluster(as_cluster("cpu:1")).num_devices
    ('cpu:2', 1)
    """
    return cluster if isinstance(cluster, Cluster) else parse_cluster(cluster)
