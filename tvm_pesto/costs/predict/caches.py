"""How TVM's unscheduled code walks memory: the cache geometry it is judged against (a line,
the L1 sets, a device's L2 sets and ways) and the strided walk of a reduction, which the
cost model's features (:mod:`~tvm_pesto.costs.predict.features`) and its miss term
(:func:`~tvm_pesto.costs.predict.roofline.miss_s`) both count with."""
from __future__ import annotations

#: Cache geometry the strided-reduction features count sets with: a 64-byte line, 64 L1
#: sets and, where a device does not say (``l2_sets`` of its descriptor), 1,024 L2 sets (a
#: 512 KiB 8-way L2; the Xeon of family 6 model 167 has 2,048 sets of 16 ways).
LINE_BYTES, L1_SETS, L2_SETS = 64, 64, 1024

#: Ways of an L2 cache set where a device does not say (``l2_ways`` of its descriptor: 8 on
#: the Zen 1 and Zen 4, 16 on the Xeon of family 6 model 167): an unscheduled reduction whose
#: strided lines map more than this many to one L2 set (``l2_conflict`` of
#: :func:`strided_reduction`) evicts each line before it comes round again under LRU.
L2_WAYS = 8

#: Most strided accesses :func:`strided_reduction` enumerates (a longer reduction repeats them).
MAX_REDUCTION_ACCESSES = 4096


def l2_sets_of(dev: dict) -> int:
    """The L2 sets of a device descriptor (``l2_sets``), :data:`L2_SETS` where it has none."""
    return int(dev.get("l2_sets") or L2_SETS)


def l2_ways_of(dev: dict) -> int:
    """The L2 ways of a device descriptor (``l2_ways``), :data:`L2_WAYS` where it has none."""
    return int(dev.get("l2_ways") or L2_WAYS)


def strided_reduction(kind: str, inputs, attrs: dict, dtype_size: float,
                      l2_sets: int = L2_SETS) -> tuple[float, float, float, float]:
    """``(stride, lines, l1_conflict, l2_conflict)`` of the strided operand of a conv2d's or
    matmul's reduction loop as TVM's unscheduled code walks it (the order of the compute
    definition: the reduction innermost): a conv2d in NCHW reads its (padded) input at a
    channel stride of H*W elements, a matmul reads B[k, j] at a stride of N. ``lines`` is the
    number of cache lines one reduction touches, a conflict the lines per cache set they
    map to (L1 and L2, :data:`L1_SETS` and ``l2_sets``): above the associativity, each
    reduction misses (a 1x1 conv over 32 channels of 32x32 runs many times slower per FLOP
    than one over 8 channels: ``python -m tvm_pesto_lab.unscheduled_kernels`` measures both). All zeros for other ops.

    Examples
    --------
    >>> s, lines, c1, c2 = strided_reduction("conv2d", [[1, 32, 32, 32], [16, 32, 1, 1]], {}, 4)
    >>> s, lines, c1
    (4096.0, 32.0, 32.0)
    >>> strided_reduction("matmul", [[64, 256], [256, 64]], {}, 4)[:2]
    (256.0, 256.0)
    >>> mm = [[128, 768], [768, 768]]                          # a 3 KiB stride: 48 lines apart
    >>> strided_reduction("matmul", mm, {}, 4)[3], strided_reduction("matmul", mm, {}, 4, l2_sets=2048)[3]
    (12.0, 6.0)
    """
    if kind == "conv2d" and len(inputs) >= 2 and len(inputs[0]) == 4 and len(inputs[1]) == 4:
        if str(attrs.get("data_layout", "NCHW")) != "NCHW":
            return 0.0, 0.0, 0.0, 0.0
        pad = [int(p) for p in (attrs.get("padding") or [0])]
        pad = (pad * 4)[:4] if len(pad) in (1, 2) else pad + [0] * (4 - len(pad))
        h, w = int(inputs[0][2]) + pad[0] + pad[2], int(inputs[0][3]) + pad[1] + pad[3]
        groups = max(int(attrs.get("groups", 1) or 1), 1)
        cin, kh = max(int(inputs[0][1]) // groups, 1), int(inputs[1][2])
        stride = h * w * dtype_size
        rcs = range(min(cin, -(-MAX_REDUCTION_ACCESSES // max(kh, 1))))  # no more than are kept below
        offsets = [rc * stride + ry * w * dtype_size for rc in rcs for ry in range(kh)]
    elif kind == "matmul" and len(inputs) >= 2 and len(inputs[1]) >= 2:
        k, n = int(inputs[1][-2]), int(inputs[1][-1])
        stride = n * dtype_size
        offsets = [i * stride for i in range(min(k, MAX_REDUCTION_ACCESSES))]
    else:
        return 0.0, 0.0, 0.0, 0.0
    lines = {int(o) // LINE_BYTES for o in offsets[:MAX_REDUCTION_ACCESSES]}
    n_lines = float(len(lines))
    return (float(stride), n_lines, n_lines / len({ln % L1_SETS for ln in lines}),
            n_lines / len({ln % max(int(l2_sets), 1) for ln in lines}))


__all__ = ["L1_SETS", "L2_SETS", "L2_WAYS", "LINE_BYTES", "MAX_REDUCTION_ACCESSES", "l2_sets_of", "l2_ways_of",
           "strided_reduction"]
