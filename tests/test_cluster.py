"""Cluster specs, JSON round trip, errors, and the link microbenchmark."""
import json

import numpy as np
import pytest

from tvm_pesto.cluster import Cluster, parse_cluster
from tvm_pesto.cluster.linkbench import measure_links
from tvm_pesto.errors import ClusterError


@pytest.mark.parametrize("spec,n,kind", [("2xV100-nvlink", 2, "gpu"), ("4xV100-pcie", 4, "gpu"),
                                         ("8xA100-nvlink", 8, "gpu"), ("h200", 1, "gpu"), ("cpu:1", 1, "cpu")])
def test_presets(spec, n, kind):
    c = parse_cluster(spec)
    assert c.num_devices == n and all(d.kind == kind for d in c.devices)
    if n > 1:
        assert c.transfer_s(0, 1, 1e6) > c.transfer_s(0, 1, 0) > 0
    assert c.transfer_s(0, 0, 1e9) == 0


def test_pcie_slower_than_nvlink():
    assert parse_cluster("4xV100-pcie").transfer_s(0, 1, 1 << 26) > parse_cluster("2xV100-nvlink").transfer_s(0, 1, 1 << 26)


def test_cpu_split_uses_disjoint_cores():
    c = parse_cluster("cpu:2")
    a, b = c.devices
    assert a.present and b.present
    assert set(a.cpu_ids).isdisjoint(b.cpu_ids) and a.cpu_ids and b.cpu_ids
    assert a.target["num-cores"] == len(a.cpu_ids)


@pytest.mark.parametrize("spec,msg", [("cpu:0", "at least 1"), ("cpu:999", "usable cores"),
                                      ("3xK80-nvlink", "unknown GPU model"), ("0xV100-pcie", "at least 1"),
                                      ("tpu-pod", "unknown cluster spec"), ("", "empty"),
                                      ("missing.json", "does not exist")])
def test_bad_specs(spec, msg):
    with pytest.raises(ClusterError, match=msg):
        parse_cluster(spec)


def test_json_round_trip(tmp_path):
    c = parse_cluster("4xV100-pcie")
    c.latency[0, 1] = 1e-3
    p = tmp_path / "c.json"
    c.to_json(str(p))
    c2 = parse_cluster(str(p))
    assert c2.num_devices == 4 and c2.latency[0, 1] == pytest.approx(1e-3)
    assert np.allclose(c2.bandwidth, c.bandwidth)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"devices": [{"kind": "gpu"}]}))
    with pytest.raises(ClusterError, match="lacks field"):
        parse_cluster(str(bad))


def test_no_devices():
    with pytest.raises(ClusterError, match="no devices"):
        Cluster("empty", [], np.zeros((0, 0)), np.zeros((0, 0)))


def test_link_microbenchmark_writes_back_a_and_b():
    c = parse_cluster("cpu:2")
    before = c.latency.copy()
    pts = measure_links(c, sizes=(1 << 10, 1 << 16, 1 << 20), repeat=5)
    assert set(pts) == {"0->1", "1->0"}
    assert c.meta["links_measured"]
    assert not np.allclose(c.latency, before)
    # A real copy + hand-off between threads takes over 100 ns, and bigger copies take
    # longer: the fit has a positive slope.
    for i, j in [(0, 1), (1, 0)]:
        assert 1e-7 <= c.latency[i, j] < 10  # seconds, measured: no bound a loaded machine can break
        assert c.bandwidth[i, j] > 1e7


# -- hosts --------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,hosts,per,net", [("2x8xA100", 2, 8, "100g"), ("2x4xV100-pcie-25g", 2, 4, "25g"),
                                                 ("3x1xH100-100g", 3, 1, "100g")])
def test_multi_host_presets(spec, hosts, per, net):
    c = parse_cluster(spec)
    assert c.num_hosts == hosts and c.num_devices == hosts * per and c.meta["network"] == net
    assert c.host_ids.tolist() == [k // per for k in range(hosts * per)]
    assert [d.index for d in c.devices] == [k % per for k in range(hosts * per)]  # CUDA index on its host
    if hosts > 1:
        inter = c.transfer_s(0, per, 1 << 26)
        assert inter > c.transfer_s(per, 0, 0) > 0
        if per > 1:  # inside a host the interconnect beats the network
            assert c.transfer_s(0, 1, 1 << 26) < inter


def test_25g_is_slower_than_100g():
    assert parse_cluster("2x2xA100-25g").transfer_s(0, 2, 1 << 26) > parse_cluster("2x2xA100-100g").transfer_s(0, 2, 1 << 26)


def test_hosts_json_round_trip_and_nic_defaults(tmp_path):
    c = parse_cluster("2x2xA100-25g")
    c.hosts[1].address = "10.0.0.2"
    p = tmp_path / "c.json"
    c.to_json(str(p))
    c2 = parse_cluster(str(p))
    assert c2.host_ids.tolist() == [0, 0, 1, 1] and c2.hosts[1].address == "10.0.0.2"
    assert np.allclose(c2.latency, c.latency) and np.allclose(c2.bandwidth, c.bandwidth)
    # A hand-written file: links between hosts default to the slower NIC of the two.
    devs = [{"kind": "cpu", "target": {"kind": "llvm"}, "memory_bytes": 1e9, "peak_flops": 1e10,
             "mem_bandwidth": 1e10, "host": h} for h in (0, 0, 1)]
    data = {"devices": devs, "default_link": {"latency_s": 1e-6, "bandwidth_Bps": 1e11},
            "hosts": [{"name": "a", "nic": {"latency_s": 5e-6, "bandwidth_Bps": 3e9}},
                      {"name": "b", "nic": {"latency_s": 9e-6, "bandwidth_Bps": 1e10}}]}
    c3 = Cluster.from_dict(data)
    assert c3.latency[0, 1] == 1e-6 and c3.bandwidth[0, 1] == 1e11  # same host
    assert c3.latency[0, 2] == 9e-6 and c3.bandwidth[2, 1] == 3e9  # between hosts


@pytest.mark.parametrize("change,msg", [({"host": 2}, "lists 1 host"), ({"host": -1}, "index >= 0")])
def test_bad_host_index(change, msg):
    dev = {"kind": "cpu", "target": {"kind": "llvm"}, "memory_bytes": 1e9, "peak_flops": 1e10, "mem_bandwidth": 1e10}
    with pytest.raises(ClusterError, match=msg):
        Cluster.from_dict({"devices": [{**dev, **change}], "hosts": [{"name": "only"}]})


def test_bad_multi_host_specs():
    with pytest.raises(ClusterError, match="unknown network"):
        parse_cluster("2x2xA100-40g")
    with pytest.raises(ClusterError, match="at least 1"):
        parse_cluster("0x8xA100")


def test_subset_keeps_the_chosen_devices_and_their_links():
    c = parse_cluster("4xV100-pcie")
    sub = c.subset([2, 0])
    assert [d.name for d in sub.devices] == [c.devices[2].name, c.devices[0].name]
    assert sub.latency[0, 1] == c.latency[2, 0] and sub.bandwidth[1, 0] == c.bandwidth[0, 2]
    assert sub.hosts == c.hosts and sub.meta == c.meta and sub.meta is not c.meta


def test_cpu_identity_tells_apart_what_the_brand_string_does_not():
    from tvm_pesto.cluster.host import parse_cpuinfo

    zen1 = parse_cpuinfo("processor : 0\nvendor_id : AuthenticAMD\ncpu family : 23\nmodel : 1\nmodel name : AMD EPYC\n"
                         "stepping : 2\ncpu MHz : 1996.248\nflags : fpu sse2 fma avx2\n\n"
                         "processor : 1\nvendor_id : Other\nflags : avx512f\n")
    zen4 = parse_cpuinfo("vendor_id : AuthenticAMD\ncpu family : 25\nmodel : 17\nmodel name : AMD EPYC\n"
                         "stepping : 1\ncpu MHz : 2596.12\nflags : fpu sse2 fma avx2 avx512f avx512_vnni\n")
    assert zen1["name"] == zen4["name"] == "AMD EPYC"
    assert (zen1["id"], zen4["id"]) == ("AuthenticAMD/23/1/2", "AuthenticAMD/25/17/1")  # the first processor's
    assert (zen1["kind"], zen4["kind"]) == ("AuthenticAMD/23/1", "AuthenticAMD/25/17")  # without the stepping
    assert zen1["isa"] == ["avx2", "fma"] and zen4["isa"] == ["avx512_vnni", "avx512f", "avx2", "fma"]
    assert (zen1["flops_per_cycle"], zen4["flops_per_cycle"]) == (32, 64) and zen1["mhz"] == 1996.248
    arm = parse_cpuinfo("processor : 0\nFeatures : fp asimd sve\nCPU implementer : 0x41\nCPU architecture: 8\n"
                        "CPU variant : 0x1\nCPU part : 0xd40\n")
    assert arm["id"] == "0x41/8/0xd40/0x1" and arm["kind"] == "0x41/8/0xd40" and arm["isa"] == ["sve", "asimd"] and arm["flops_per_cycle"] == 8
    bare = parse_cpuinfo("")
    assert bare == {"name": "", "id": "", "kind": "", "isa": [], "mhz": None, "cache": "",
                    "flops_per_cycle": None}


def test_cpu_devices_carry_their_cpu_kind_through_cluster_json():
    from tvm_pesto.cluster.host import cpu_identity

    c = parse_cluster("cpu:2")
    assert {d.cpu_kind for d in c.devices} == {cpu_identity()["kind"]}
    back = Cluster.from_dict(json.loads(json.dumps(c.to_dict())))
    assert [d.cpu_kind for d in back.devices] == [d.cpu_kind for d in c.devices]
    assert parse_cluster("h200").devices[0].cpu_kind == ""


def test_cpu_devices_are_priced_from_the_cpu_identity(monkeypatch):
    from tvm_pesto.cluster import specs
    from tvm_pesto.cluster.host import parse_cpuinfo

    monkeypatch.setattr(specs, "cpu_identity", lambda: parse_cpuinfo("cpu MHz : 2000\nflags : avx2 fma\n"))
    assert specs.cpu_info()[1] == pytest.approx(2.0e9 * 32)
    monkeypatch.setattr(specs, "cpu_identity", lambda: parse_cpuinfo("flags : avx512f\n"))
    assert specs.cpu_info()[1] == pytest.approx(2.5e9 * 64)  # no clock reported: 2.5 GHz
    monkeypatch.setattr(specs, "cpu_identity", lambda: parse_cpuinfo(""))
    assert specs.cpu_info()[1] == pytest.approx(2.5e9 * 16)
