"""``TVM_PESTO_CPU_KIND`` (issue 28): this machine's CPU taken as another kind, read at every
call (``/proc/cpuinfo`` once per process), carried by the CPU devices and their keys, and a
clear error when it is not ``vendor/family/model``."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from tvm_pesto.cli.main import cli
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.cluster.host import CPU_KIND_ENV, cpu_identity
from tvm_pesto.costs.predict.features import device_descriptor, device_key
from tvm_pesto.errors import ClusterError


def test_the_kind_is_overridden_at_every_call(monkeypatch):
    monkeypatch.delenv(CPU_KIND_ENV, raising=False)
    own = cpu_identity()
    for kind in ("GenuineIntel/6/999", "AuthenticAMD/23/1"):  # changed within one process
        monkeypatch.setenv(CPU_KIND_ENV, kind)
        ident = cpu_identity()
        assert (ident["kind"], ident["id"]) == (kind, kind)
        # only the kind: what the CPU can do is still read from it
        assert {k: ident[k] for k in ("name", "isa", "mhz", "flops_per_cycle")} == {
            k: own[k] for k in ("name", "isa", "mhz", "flops_per_cycle")}
        dev = parse_cluster("cpu:1").devices[0]
        assert dev.cpu_kind == kind and device_key(device_descriptor(dev)).endswith("@" + kind)
    cpu_identity()["isa"].append("no-such-flag")  # a copy: the caller cannot change the next one
    assert "no-such-flag" not in cpu_identity()["isa"]
    monkeypatch.setenv(CPU_KIND_ENV, "")  # empty: this machine's own
    assert cpu_identity() == own


@pytest.mark.parametrize("value", ["AMD EPYC", "AuthenticAMD/23", "AuthenticAMD/23/1/2", "a//b", "x/y/z@w"])
def test_a_kind_that_is_not_vendor_family_model_is_refused(monkeypatch, value):
    monkeypatch.setenv(CPU_KIND_ENV, value)
    problem = rf"\$TVM_PESTO_CPU_KIND '{re.escape(value)}' is not a CPU kind vendor/family/model"
    with pytest.raises(ClusterError, match=problem + r".*e\.g\. AuthenticAMD/25/17.*unset it for this machine's own kind"):
        cpu_identity()
    res = CliRunner().invoke(cli, ["cluster", "show", "cpu:1"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "TVM_PESTO_CPU_KIND" in res.output and "vendor/family/model" in " ".join(res.output.split())
