"""GPT-2 style decoder stack (Radford et al., 2019) with random weights.

Float token embeddings ``(batch, seq, hidden)`` plus a learned position embedding go
through pre-LayerNorm blocks: causal multi-head self-attention with one fused QKV
projection, and a tanh-GELU MLP, each added to the residual stream; a final LayerNorm
gives the output (no language-model head). ``full`` is GPT-2 small (12 layers, hidden
768, 12 heads, seq 128, batch 1); ``small`` has 2 layers, hidden 64, 4 heads, seq 64.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ._common import preset, seeded_inputs
from ._transformer import SelfAttention, transformer_init

PRESETS = {
    "small": dict(batch=1, seq=64, hidden=64, layers=2, heads=4),
    "full": dict(batch=1, seq=128, hidden=768, layers=12, heads=12),
}


class GPT2Block(nn.Module):
    """Pre-LN decoder block: x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, hidden: int, heads: int, seq: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads, seq, causal=True, fused_qkv=True)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * hidden, hidden))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT2(nn.Module):
    """Decoder stack on float embeddings.

    Parameters
    ----------
    seq, hidden, layers, heads : int
        Sequence length, model width, blocks, attention heads.
    """

    def __init__(self, seq: int = 128, hidden: int = 768, layers: int = 12, heads: int = 12):
        super().__init__()
        self.position = nn.Parameter(torch.randn(seq, hidden))
        self.blocks = nn.Sequential(*(GPT2Block(hidden, heads, seq) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, embeddings):
        return self.ln_f(self.blocks(embeddings + self.position))


def build(size: str = "small") -> tuple[nn.Module, tuple[np.ndarray, ...]]:
    """Build the seeded GPT-2 style decoder of a preset size and its example input.

    Parameters
    ----------
    size : {"small", "full"}
        ``small``: 2 blocks, hidden 64, seq 64. ``full``: GPT-2 small at seq 128.

    Returns
    -------
    model : torch.nn.Module
        In eval mode.
    inputs : tuple of numpy.ndarray
        One ``(batch, seq, hidden)`` float32 embedding tensor.

    Examples
    --------
    >>> model, (x,) = build("small")
    >>> x.shape
    (1, 64, 64)
    """
    p = preset(PRESETS, "gpt2", size)
    batch = p.pop("batch")
    torch.manual_seed(0)
    model = transformer_init(GPT2(**p)).eval()
    return model, seeded_inputs([(batch, p["seq"], p["hidden"])])
