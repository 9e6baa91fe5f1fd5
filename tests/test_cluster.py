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
    # A real copy + hand-off between threads takes between 100 ns and 50 ms, and bigger
    # copies take longer: the fit has a positive slope.
    for i, j in [(0, 1), (1, 0)]:
        assert 1e-7 <= c.latency[i, j] < 5e-2
        assert c.bandwidth[i, j] > 1e7
