"""Write the models of tests/outside_zoo.py (built from torch.nn layers the zoo does not use)
as model files a user would have: ONNX and torch.export programs.

    python lab/scripts/export_outside_zoo.py --size full --dir outside-zoo/
    tvm-pesto bench search outside-zoo/*.pt2 --json search.json

Run it to get model files to try tvm-pesto on as a user would (``tvm-pesto run FILE``,
``tvm-pesto bench search FILE``). Nothing is downloaded; the weights are random (seeded).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

import outside_zoo as oz  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="full", choices=["small", "full"])
    ap.add_argument("--dir", default="outside-zoo")
    ap.add_argument("--formats", default="pt2,onnx", help="comma-separated: pt2, onnx")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    for name in oz.list_models():
        for fmt in args.formats.split(","):
            path = (oz.write_pt2 if fmt == "pt2" else oz.write_onnx)(name, args.dir, args.size)
            print(path)


if __name__ == "__main__":
    main()
