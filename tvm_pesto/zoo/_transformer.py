"""Transformer pieces shared by the BERT and GPT-2 style zoo models.

Attention is written out with ``matmul`` and ``softmax`` (no fused
``scaled_dot_product_attention``) so that it imports into plain Relax operators.
"""
from __future__ import annotations

import math

import torch
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head self-attention on ``(batch, seq, hidden)`` inputs.

    Parameters
    ----------
    hidden : int
        Model width; must be divisible by ``heads``.
    heads : int
        Number of attention heads.
    seq : int
        Sequence length (needed for the causal mask).
    causal : bool
        Add a constant mask so position ``i`` only attends to positions ``<= i``.
    fused_qkv : bool
        One ``hidden -> 3*hidden`` projection split into Q, K, V (GPT-2) instead of three
        separate projections (BERT).
    """

    def __init__(self, hidden: int, heads: int, seq: int, causal: bool = False, fused_qkv: bool = False):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
        self.heads, self.head_dim = heads, hidden // heads
        self.fused_qkv = fused_qkv
        if fused_qkv:
            self.qkv = nn.Linear(hidden, 3 * hidden)
        else:
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)
        self.causal = causal
        if causal:
            mask = torch.triu(torch.full((seq, seq), -1e9), diagonal=1)
            self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, s, h = x.shape
        if self.fused_qkv:
            q, k, v = self.qkv(x).split(h, dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q = q.reshape(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)
        k = k.reshape(b, s, self.heads, self.head_dim).permute(0, 2, 3, 1)
        v = v.reshape(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)
        scores = torch.matmul(q, k) * (1.0 / math.sqrt(self.head_dim))
        if self.causal:
            scores = scores + self.mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(ctx.permute(0, 2, 1, 3).reshape(b, s, h))


def transformer_init(model: nn.Module) -> nn.Module:
    """Variance-preserving random weights: normal(0, 1/fan_in) for linear/conv, zero biases.

    The real models use std 0.02, under which the attention and MLP branches of a random
    network barely change the residual stream; fan-in scaling makes every branch matter,
    so a wrong operator shows up in the output.
    """
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            fan_in = m.weight[0].numel()
            nn.init.normal_(m.weight, 0.0, fan_in ** -0.5)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model
