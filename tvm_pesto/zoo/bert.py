"""BERT-style encoder (Devlin et al., 2019) with random weights.

The input is the float token embedding ``(batch, seq, hidden)`` rather than token ids,
so the graph has no integer gather; a learned position embedding is added and
normalised, then each post-LayerNorm layer applies multi-head self-attention (separate
Q/K/V projections, matmul + softmax) and a GELU feed-forward network, each with a
residual connection. The output is the last hidden state. ``full`` is BERT-base
(12 layers, hidden 768, 12 heads, FFN 3072, seq 128, batch 1); ``small`` has 2 layers,
hidden 64, 4 heads, FFN 256, seq 64.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ._common import preset, seeded_inputs
from ._transformer import SelfAttention, transformer_init

PRESETS = {
    "small": dict(batch=1, seq=64, hidden=64, layers=2, heads=4, ffn=256),
    "full": dict(batch=1, seq=128, hidden=768, layers=12, heads=12, ffn=3072),
}


class BertLayer(nn.Module):
    """Post-LN encoder layer: LN(x + attn(x)), then LN(x + FFN(x))."""

    def __init__(self, hidden: int, heads: int, ffn: int, seq: int):
        super().__init__()
        self.attn = SelfAttention(hidden, heads, seq)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ffn(x))


class Bert(nn.Module):
    """BERT encoder on float embeddings.

    Parameters
    ----------
    seq, hidden, layers, heads, ffn : int
        Sequence length, model width, encoder layers, attention heads, FFN width.
    """

    def __init__(self, seq: int = 128, hidden: int = 768, layers: int = 12, heads: int = 12, ffn: int = 3072):
        super().__init__()
        self.position = nn.Parameter(torch.randn(seq, hidden))
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.Sequential(*(BertLayer(hidden, heads, ffn, seq) for _ in range(layers)))

    def forward(self, embeddings):
        return self.layers(self.ln(embeddings + self.position))


def build(size: str = "small") -> tuple[nn.Module, tuple[np.ndarray, ...]]:
    """Build the seeded BERT encoder of a preset size and its example input.

    Parameters
    ----------
    size : {"small", "full"}
        ``small``: 2 layers, hidden 64, seq 64. ``full``: BERT-base at seq 128.

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
    p = preset(PRESETS, "bert", size)
    batch = p.pop("batch")
    torch.manual_seed(0)
    model = transformer_init(Bert(**p)).eval()
    return model, seeded_inputs([(batch, p["seq"], p["hidden"])])
