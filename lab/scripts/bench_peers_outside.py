"""``tvm-pesto bench peers`` on three models outside the zoo and its outside set: a CNN whose
convolutions pad explicitly (``nn.ZeroPad2d`` before an unpadded conv, as "same"-padded ports
of TensorFlow models do) and the T5- and DistilBERT-style encoders of
``tests/user_encoders.py`` (position ids and buckets from ``arange``). Models like these lost
every whole-model library option while the ONNX exporter lacked ``nn.pad`` and while an
``arange`` of numbers was left unfolded (issue 53).

Usage::

    python lab/scripts/bench_peers_outside.py --json peers_outside.json

Prints, per model, the best own-library peer, the ratio (best peer over tvm-pesto's default
build on ``cpu:N``), the build seconds, the build's max error against PyTorch and its backend
mix, and every variant's milliseconds a call; the JSON is :func:`tvm_pesto.bench.peers.bench_peers`'s.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))  # the user encoders
from user_encoders import build, relax_module  # noqa: E402

from tvm_pesto.bench.peer_settings import PeerSettings  # noqa: E402
from tvm_pesto.bench.peers import bench_peers  # noqa: E402
from tvm_pesto.frontend import from_torch  # noqa: E402


def _block(cin, cout, stride, expand=4):
    mid = cin * expand
    return nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(), nn.ZeroPad2d(1),
                         nn.Conv2d(mid, mid, 3, stride, 0, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
                         nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))


class PadNet(nn.Module):
    """A MobileNetV2-style CNN (inverted residual blocks without the residuals) padding explicitly."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(3, 16, 3, 2, 0, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU6())
        self.blocks = nn.Sequential(_block(16, 24, 2), _block(24, 24, 1), _block(24, 32, 2), _block(32, 32, 1),
                                    _block(32, 64, 2))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def padnet():
    torch.manual_seed(0)
    model = PadNet().eval()
    x = (np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype("float32"),)
    return model, x, from_torch(model, x, name="padnet")


def encoder(name):
    def make():
        model, inputs = build(name)
        return model, inputs, relax_module(name)[0]
    return make


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write bench_peers' result here")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    res = bench_peers([("padnet", padnet), ("t5", encoder("t5")), ("distilbert", encoder("distilbert"))],
                      PeerSettings(torch_compile=False, rounds=args.rounds, overhead=False))
    for name, m in res["models"].items():
        v = m["variants"]
        ms = {k: round(1e3 * x["seconds"], 4) for k, x in v.items() if "seconds" in x}
        print(f"{name}: best peer {m['best_peer']}, ratio {m['ratio_vs_best_peer']:.3f}, build {m['build_s']} s, "
              f"max err {m['max_abs_err']:.2g}, kept {v['pesto'].get('backend_mix')}")
        print(f"  ms: {ms}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, default=str))


if __name__ == "__main__":
    main()
