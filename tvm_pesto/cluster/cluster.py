"""Devices, hosts, links and clusters.

A :class:`Cluster` is a list of :class:`Device` plus a directed link model between every
ordered pair: moving ``n`` bytes from device ``i`` to ``j`` takes ``latency[i, j] +
n / bandwidth[i, j]`` seconds (the a + b·bytes fit Pesto and Baechi use).

Every device belongs to a :class:`Host` (``Device.host``, an index into ``Cluster.hosts``;
one host unless a spec says otherwise). Links between devices of one host are the host's
interconnect (NVLink, PCIe, shared memory); links between hosts go through the hosts'
network interfaces (Ethernet, InfiniBand), and every transfer that leaves a host shares its
NIC: the simulator runs one such transfer at a time per host and direction
(:mod:`tvm_pesto.plan.reference`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import ClusterError


@dataclass
class Device:
    """One device that runs operators.

    ``present`` is true when the device exists on this machine and can run code; devices
    from GPU presets on a machine without GPUs are simulated (costs from a model only).
    ``cpu_ids`` pins a CPU device to those cores. ``host`` is the index of its host in
    :attr:`Cluster.hosts`. ``rpc_tracker`` (``HOST:PORT``) and ``rpc_key`` name a TVM RPC
    tracker and the key of the device's server there: when set, measured costs of this
    device are timed on that server (:mod:`tvm_pesto.costs.measure.remote`). ``cpu_kind`` is a CPU
    device's microarchitecture as ``vendor/family/model`` (``AuthenticAMD/23/1``; ``""`` where
    unknown, as for a remote device): two VMs of one brand string can differ 3x in kernel speed,
    and the cost model tells them apart by it. ``l2_sets`` and ``l2_ways`` are its level-2
    cache's geometry (0 where unknown), which decides when an unscheduled reduction's strided
    lines evict each other (:func:`tvm_pesto.costs.predict.roofline.miss_s`).
    """

    name: str
    kind: str  # "cpu" or "gpu"
    target: dict
    memory_bytes: float
    peak_flops: float
    mem_bandwidth: float
    cores: int = 1
    index: int = 0
    present: bool = False
    cpu_ids: tuple[int, ...] = ()
    model: str = ""
    host: int = 0
    rpc_tracker: str = ""
    rpc_key: str = ""
    cpu_kind: str = ""
    l2_sets: int = 0
    l2_ways: int = 0

    @property
    def remote(self) -> bool:
        """True when the device is measured over TVM RPC (``rpc_key`` set)."""
        return bool(self.rpc_key)

    def tvm_device(self):
        """The ``tvm.runtime.Device`` this device runs on."""
        import tvm

        return tvm.cpu(self.index) if self.kind == "cpu" else tvm.cuda(self.index)

    def roofline_s(self, flops: float, nbytes: float) -> float:
        """Time bound max(FLOPs / peak, bytes / bandwidth) in seconds."""
        return max(flops / self.peak_flops, nbytes / self.mem_bandwidth)


@dataclass
class Host:
    """A machine of the cluster.

    ``address`` is the host's IP address or name as the Ray cluster knows it (its
    ``NodeManagerAddress``; empty: any node, e.g. this machine). ``nic_latency_s`` and
    ``nic_bandwidth_Bps`` are its network interface per direction; a link between devices
    of two hosts defaults to the slower NIC of the two (the larger latency, the smaller
    bandwidth).
    """

    name: str
    address: str = ""
    nic_latency_s: float = 20e-6
    nic_bandwidth_Bps: float = 10e9

    def to_dict(self) -> dict:
        return {"name": self.name, "address": self.address,
                "nic": {"latency_s": float(self.nic_latency_s), "bandwidth_Bps": float(self.nic_bandwidth_Bps)}}


@dataclass
class Cluster:
    """Devices, the hosts they belong to, and the links between them.

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> c = parse_cluster("2xV100-nvlink")
    >>> c.num_devices, round(c.transfer_s(0, 1, 0) * 1e6, 1)
    (2, 5.0)
    """

    name: str
    devices: list[Device]
    latency: np.ndarray  # [d, d] seconds
    bandwidth: np.ndarray  # [d, d] bytes / second
    meta: dict = field(default_factory=dict)
    hosts: list = field(default_factory=list)  # Host per host index (default: one per index the devices name)

    def __post_init__(self):
        d = len(self.devices)
        if d == 0:
            raise ClusterError(f"cluster {self.name!r} has no devices; give at least one (e.g. 'cpu:1')")
        for dev in self.devices:
            if not (isinstance(dev.host, (int, np.integer)) and dev.host >= 0):
                raise ClusterError(f"device {dev.name!r} has host {dev.host!r}; a host is an index >= 0 into the "
                                   "cluster's hosts")
        if not self.hosts:
            self.hosts = [Host(f"host{k}") for k in range(max(int(dv.host) for dv in self.devices) + 1)]
        self.hosts = [h if isinstance(h, Host) else _hosts_from_json([h])[0] for h in self.hosts]
        for dev in self.devices:
            if dev.host >= len(self.hosts):
                raise ClusterError(f"device {dev.name!r} is on host {dev.host}, but cluster {self.name!r} lists "
                                   f"{len(self.hosts)} host(s); add the host or fix the device's 'host'")
        self.latency = np.asarray(self.latency, dtype=np.float64).reshape(d, d)
        self.bandwidth = np.asarray(self.bandwidth, dtype=np.float64).reshape(d, d)
        off = ~np.eye(d, dtype=bool)
        for what, values, bad, rule in (("latency", self.latency, ~(self.latency >= 0), "a time >= 0 (seconds)"),
                                        ("bandwidth", self.bandwidth, ~(self.bandwidth > 0),
                                         "a rate > 0 (bytes per second)")):
            if (bad & off).any():
                i, j = (int(x) for x in np.argwhere(bad & off)[0])
                raise ClusterError(f"cluster {self.name!r}: link {i}->{j} ({self.devices[i].name} -> "
                                   f"{self.devices[j].name}) has {what} {values[i, j]:g}; give it {rule}")
        np.fill_diagonal(self.latency, 0.0)
        np.fill_diagonal(self.bandwidth, np.inf)
        for dev in self.devices:
            for what in ("memory_bytes", "peak_flops", "mem_bandwidth"):
                if not getattr(dev, what) > 0:
                    raise ClusterError(f"device {dev.name!r} has {what} {getattr(dev, what):g}; memory, peak FLOP/s "
                                       "and memory bandwidth must be numbers > 0")

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        if src == dst:
            return 0.0
        return float(self.latency[src, dst] + nbytes / self.bandwidth[src, dst])

    @property
    def host_ids(self) -> np.ndarray:
        """The host index of each device (int32, one entry per device)."""
        return np.array([int(dev.host) for dev in self.devices], dtype=np.int32)

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)

    def capacities(self) -> np.ndarray:
        return np.array([dev.memory_bytes for dev in self.devices], dtype=np.float64)

    def inv_bandwidth(self) -> np.ndarray:
        """Seconds per byte, zero on the diagonal."""
        inv = 1.0 / self.bandwidth
        np.fill_diagonal(inv, 0.0)
        return inv

    @property
    def all_present(self) -> bool:
        return all(dev.present for dev in self.devices)

    def with_memory(self, memory_bytes: float) -> "Cluster":
        """A copy whose every device has ``memory_bytes`` of memory."""
        devs = [Device(**{**asdict(dv), "memory_bytes": float(memory_bytes)}) for dv in self.devices]
        return Cluster(self.name, devs, self.latency.copy(), self.bandwidth.copy(), dict(self.meta), list(self.hosts))

    def subset(self, indices) -> "Cluster":
        """The cluster of the devices ``indices`` (in that order) and the links between them."""
        idx = [int(i) for i in indices]
        return Cluster(self.name, [self.devices[i] for i in idx], self.latency[np.ix_(idx, idx)],
                       self.bandwidth[np.ix_(idx, idx)], dict(self.meta), list(self.hosts))

    # -- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = self.num_devices
        links = [
            {"src": i, "dst": j, "latency_s": float(self.latency[i, j]), "bandwidth_Bps": float(self.bandwidth[i, j])}
            for i in range(d) for j in range(d) if i != j
        ]
        devs = []
        for dev in self.devices:
            dd = asdict(dev)
            dd["cpu_ids"] = list(dev.cpu_ids)
            devs.append(dd)
        return {"name": self.name, "devices": devs, "hosts": [h.to_dict() for h in self.hosts], "links": links,
                "meta": self.meta}

    def to_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)

    @classmethod
    def from_dict(cls, data: dict, name: str = "cluster") -> "Cluster":
        try:
            raw_devs = data["devices"]
        except (KeyError, TypeError):
            raise ClusterError("cluster JSON needs a 'devices' list; `tvm-pesto cluster show cpu:2` prints an "
                              "example of the format") from None
        devs = []
        for k, dd in enumerate(raw_devs):
            try:
                devs.append(Device(
                    name=str(dd.get("name", f"dev{k}")), kind=str(dd["kind"]), target=dict(dd["target"]),
                    memory_bytes=float(dd["memory_bytes"]), peak_flops=float(dd["peak_flops"]),
                    mem_bandwidth=float(dd["mem_bandwidth"]), cores=int(dd.get("cores", 1)),
                    index=int(dd.get("index", k)), present=bool(dd.get("present", False)),
                    cpu_ids=tuple(dd.get("cpu_ids", ())), model=str(dd.get("model", "")),
                    host=int(dd.get("host", 0)), rpc_tracker=str(dd.get("rpc_tracker", "")),
                    rpc_key=str(dd.get("rpc_key", "")), cpu_kind=str(dd.get("cpu_kind", "")),
                    l2_sets=int(dd.get("l2_sets", 0)), l2_ways=int(dd.get("l2_ways", 0)),
                ))
            except KeyError as e:
                raise ClusterError(f"cluster JSON device {k} lacks field {e.args[0]!r} "
                                   "(needs kind, target, memory_bytes, peak_flops, mem_bandwidth)") from None
            except (TypeError, ValueError, AttributeError) as e:
                raise ClusterError(f"cluster JSON device {k} has a field of the wrong type ({e}); memory_bytes, "
                                   "peak_flops and mem_bandwidth are numbers, target an object") from None
            if devs[-1].kind not in ("cpu", "gpu"):
                raise ClusterError(f"device {k}: kind must be 'cpu' or 'gpu', not {devs[-1].kind!r}")
        d = len(devs)
        hosts = _hosts_from_json(data.get("hosts", []))
        dl = _link_fields(data.get("default_link", {"latency_s": 20e-6, "bandwidth_Bps": 10e9}), "default_link")
        lat = np.full((d, d), dl[0])
        bw = np.full((d, d), dl[1])
        if hosts:  # between hosts: the slower of the two NICs
            for i, a in enumerate(devs):
                for j, b in enumerate(devs):
                    if a.host != b.host and max(a.host, b.host) < len(hosts):
                        ha, hb = hosts[a.host], hosts[b.host]
                        lat[i, j] = max(ha.nic_latency_s, hb.nic_latency_s)
                        bw[i, j] = min(ha.nic_bandwidth_Bps, hb.nic_bandwidth_Bps)
        for k, ln in enumerate(data.get("links", [])):
            try:
                i, j = int(ln["src"]), int(ln["dst"])
            except (KeyError, TypeError, ValueError):
                raise ClusterError(f"cluster JSON link #{k} needs integer 'src' and 'dst' device indices, got "
                                   f"{ln!r}") from None
            if not (0 <= i < d and 0 <= j < d):
                raise ClusterError(f"link {i}->{j} names a device outside 0..{d - 1}")
            lat[i, j], bw[i, j] = _link_fields(ln, f"link {i}->{j}")
        return cls(str(data.get("name", name)), devs, lat, bw, dict(data.get("meta", {})), hosts)


def _hosts_from_json(raw) -> list[Host]:
    """The ``hosts`` list of a cluster JSON file: ``{"name", "address", "nic": {"latency_s",
    "bandwidth_Bps"}}`` per host, checked."""
    if not isinstance(raw, list):
        raise ClusterError(f"cluster JSON 'hosts' must be a list of objects, got {type(raw).__name__}")
    hosts = []
    for k, h in enumerate(raw):
        if not isinstance(h, dict):
            raise ClusterError(f"cluster JSON host #{k} must be an object with 'name', 'address' and 'nic', "
                               f"got {h!r}")
        nic = _link_fields(h.get("nic", {"latency_s": 20e-6, "bandwidth_Bps": 10e9}), f"host #{k} nic")
        hosts.append(Host(str(h.get("name", f"host{k}")), str(h.get("address", "")), nic[0], nic[1]))
    return hosts


def _link_fields(ln, where: str) -> tuple[float, float]:
    """``(latency_s, bandwidth_Bps)`` of a link entry of a cluster JSON file, checked."""
    try:
        lat, bw = float(ln["latency_s"]), float(ln["bandwidth_Bps"])
    except (KeyError, TypeError, ValueError):
        raise ClusterError(f"cluster JSON {where} needs numbers 'latency_s' (seconds) and 'bandwidth_Bps' "
                           f"(bytes per second), got {ln!r}") from None
    if not lat >= 0:
        raise ClusterError(f"cluster JSON {where} has latency_s {lat:g}; give a time >= 0 (seconds)")
    if not bw > 0:
        raise ClusterError(f"cluster JSON {where} has bandwidth_Bps {bw:g}; give a rate > 0 (bytes per second, "
                           "e.g. 1e10 for 10 GB/s)")
    return lat, bw
