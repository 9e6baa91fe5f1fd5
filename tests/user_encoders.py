"""Small transformer encoders shaped like models users bring (not in the zoo), seeded random
weights, in eval mode, with int64 token ids and an int64 attention mask as inputs.

- ``t5``: a T5-style encoder. Relative position bias from ``arange`` with int64 bucketing
  (sign, ``abs``, ``log`` for far positions, ``min``, ``where``), looked up per head in the
  first layer and reused by the next; RMS layer norm without bias; an additive mask
  ``(1 - mask) * finfo.min``.
- ``distilbert``: a DistilBERT-style encoder. Position ids from ``arange`` broadcast over the
  batch, shifted by a constant offset (as OPT's learned positions), post-LN layers, a boolean
  mask ``mask == 0`` filled into the scores with ``masked_fill``.

Examples
--------
>>> from user_encoders import build
>>> model, (ids, mask) = build("t5")
>>> ids.shape, mask.dtype
((2, 16), dtype('int64'))
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

VOCAB, SEQ, DIM, HEADS, FFN, LAYERS = 64, 16, 32, 2, 64, 2


def _heads(x, heads):
    b, s, d = x.shape
    return x.view(b, s, heads, d // heads).transpose(1, 2)


class T5Attention(nn.Module):
    """T5 self-attention: no scaling, a relative position bias (first layer only) added to the scores."""

    def __init__(self, buckets: int = 8, max_distance: int = 16, has_bias: bool = True):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.buckets, self.max_distance = buckets, max_distance
        self.rel = nn.Embedding(buckets, HEADS) if has_bias else None

    def bucket(self, rel):
        half = self.buckets // 2
        out = (rel > 0).to(torch.long) * half
        rel = torch.abs(rel)
        exact = half // 2
        far = exact + (torch.log(rel.float() / exact) / math.log(self.max_distance / exact)
                       * (half - exact)).to(torch.long)
        far = torch.min(far, torch.full_like(far, half - 1))
        return out + torch.where(rel < exact, rel, far)

    def position_bias(self, n):
        ctx = torch.arange(n, dtype=torch.long)[:, None]
        mem = torch.arange(n, dtype=torch.long)[None, :]
        return self.rel(self.bucket(mem - ctx)).permute(2, 0, 1).unsqueeze(0)

    def forward(self, x, bias, mask):
        q, k, v = _heads(self.q(x), HEADS), _heads(self.k(x), HEADS), _heads(self.v(x), HEADS)
        if bias is None:
            bias = self.position_bias(x.shape[1]) + mask
        w = torch.softmax(torch.matmul(q, k.transpose(3, 2)) + bias, dim=-1)
        return self.o(torch.matmul(w, v).transpose(1, 2).reshape(x.shape)), bias


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(DIM))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class T5Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.attn = nn.ModuleList(T5Attention(has_bias=i == 0) for i in range(LAYERS))
        self.ln1, self.ln2 = (nn.ModuleList(RMSNorm() for _ in range(LAYERS)) for _ in range(2))
        self.wi = nn.ModuleList(nn.Linear(DIM, FFN, bias=False) for _ in range(LAYERS))
        self.wo = nn.ModuleList(nn.Linear(FFN, DIM, bias=False) for _ in range(LAYERS))
        self.final = RMSNorm()

    def forward(self, ids, mask):
        x = self.emb(ids)
        add_mask = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        bias = None
        for i in range(LAYERS):
            h, bias = self.attn[i](self.ln1[i](x), bias, add_mask)
            x = x + h
            x = x + self.wo[i](torch.relu(self.wi[i](self.ln2[i](x))))
        return self.final(x)


class DistilBertEncoder(nn.Module):
    OFFSET = 2

    def __init__(self):
        super().__init__()
        self.word = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ + self.OFFSET, DIM)
        self.ln = nn.LayerNorm(DIM)
        self.layers = nn.ModuleList(
            nn.ModuleDict(dict(q=nn.Linear(DIM, DIM), k=nn.Linear(DIM, DIM), v=nn.Linear(DIM, DIM),
                               o=nn.Linear(DIM, DIM), ln1=nn.LayerNorm(DIM), l1=nn.Linear(DIM, FFN),
                               l2=nn.Linear(FFN, DIM), ln2=nn.LayerNorm(DIM)))
            for _ in range(LAYERS))

    def forward(self, ids, mask):
        b, s = ids.shape
        pos = torch.arange(s, dtype=torch.long).unsqueeze(0).expand_as(ids).reshape(-1) + self.OFFSET
        x = self.ln(self.word(ids) + self.pos(pos).view(b, s, DIM))
        masked = (mask == 0).view(b, 1, 1, s)
        for L in self.layers:
            q = _heads(L["q"](x), HEADS) / math.sqrt(DIM // HEADS)
            k, v = _heads(L["k"](x), HEADS), _heads(L["v"](x), HEADS)
            scores = torch.matmul(q, k.transpose(2, 3))
            scores = scores.masked_fill(masked.expand_as(scores), torch.finfo(scores.dtype).min)
            ctx = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, s, DIM)
            x = L["ln1"](L["o"](ctx) + x)
            x = L["ln2"](L["l2"](nn.functional.gelu(L["l1"](x))) + x)
        return x


MODELS = {"t5": T5Encoder, "distilbert": DistilBertEncoder}


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[np.ndarray, np.ndarray]]:
    """The model (seeded weights, eval mode) and example inputs: token ids, and a mask whose
    second row masks out its last positions."""
    torch.manual_seed(seed)
    model = MODELS[name]().eval()
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (2, SEQ)).astype("int64")
    mask = np.ones((2, SEQ), dtype="int64")
    mask[1, SEQ - 5:] = 0
    return model, (ids, mask)


def relax_module(name: str):
    """The model imported with ``torch.export`` and tvm-pesto's frontend, with its inputs and
    PyTorch's output."""
    from tvm_pesto.frontend import from_exported_program

    model, inputs = build(name)
    args = tuple(torch.from_numpy(a) for a in inputs)
    with torch.no_grad():
        ep = torch.export.export(model, args)
        want = model(*args).numpy()
    return from_exported_program(ep, name), inputs, want
