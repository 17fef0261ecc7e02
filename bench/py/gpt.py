"""The reference GPT in Python PyTorch: the benchmark peer of trireme/models/gpt.cpp.

Same module tree, parameter names and shapes as the C++ GptImpl (wte, wpe, h.<i>.ln_1,
h.<i>.attn.qkv, h.<i>.attn.proj, h.<i>.ln_2, h.<i>.mlp.fc, h.<i>.mlp.proj, ln_f, head without
bias and not tied), the same causal SDPA attention and tanh GELU, so parameter counts match
exactly. Initialisation uses the same scheme in the same order from a local torch.Generator
seeded with `seed` (normal(0, 0.02); residual projections normal(0, 0.02/sqrt(2L)); biases 0;
LayerNorm 1/0). It draws from the same CPU generator (mt19937) as the C++ side, so for the
same config and seed both produce identical parameters and identical logits (checked on
torch 2.7.1, CPU).

Shapes: B batch, T sequence, C dim, H heads, D = C/H, V vocab.

Self-check:  python bench/py/gpt.py --layers 4 --dim 128 --heads 4 --seq 128 --vocab 256
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

INIT_STD = 0.02  # GPT-2


@dataclass
class GptConfig:
    vocab: int = 256
    seq_len: int = 128
    layers: int = 4
    dim: int = 128
    heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0

    def validate(self) -> None:
        if self.dim % self.heads != 0:
            raise ValueError(f"--dim {self.dim} is not divisible by --heads {self.heads}; "
                             "choose a dim that is a multiple of heads")

    def num_parameters(self) -> int:
        """Closed form, identical to GptConfig::num_parameters() in C++."""
        C, V, T, R = self.dim, self.vocab, self.seq_len, self.mlp_ratio
        block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (R * C * C + R * C) + (R * C * C + C)
        return V * C + T * C + self.layers * block + 2 * C + C * V


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GptConfig):
        super().__init__()
        self.heads = cfg.heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        D = C // self.heads
        q, k, v = self.qkv(x).split(C, dim=2)                  # 3 x (B,T,C)
        q = q.view(B, T, self.heads, D).transpose(1, 2)         # (B,H,T,D)
        k = k.view(B, T, self.heads, D).transpose(1, 2)         # (B,H,T,D)
        v = v.view(B, T, self.heads, D).transpose(1, 2)         # (B,H,T,D)
        y = F.scaled_dot_product_attention(
            q, k, v, None, self.dropout if self.training else 0.0, is_causal=True)  # (B,H,T,D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)        # (B,T,C)
        return F.dropout(self.proj(y), self.dropout, self.training)


class Mlp(nn.Module):
    def __init__(self, cfg: GptConfig):
        super().__init__()
        self.dropout = cfg.dropout
        self.fc = nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc(x), approximate="tanh")              # (B,T,R*C)
        return F.dropout(self.proj(h), self.dropout, self.training)  # (B,T,C)


class Block(nn.Module):
    def __init__(self, cfg: GptConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.dim)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.dim)
        self.mlp = Mlp(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))                          # (B,T,C)
        return x + self.mlp(self.ln_2(x))                        # (B,T,C)


class Gpt(nn.Module):
    def __init__(self, cfg: GptConfig, seed: int = 0):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.dim)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.dim)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.init_parameters(seed)

    @torch.no_grad()
    def init_parameters(self, seed: int) -> None:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        residual_std = INIT_STD / math.sqrt(2.0 * self.cfg.layers)
        for name, p in self.named_parameters():
            owner = name.split(".")[-2] if "." in name else ""
            if name.endswith(".bias"):
                p.zero_()
            elif owner.startswith("ln_"):
                p.fill_(1.0)
            elif name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                p.normal_(0.0, residual_std, generator=gen)
            else:
                p.normal_(0.0, INIT_STD, generator=gen)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)                 # (T)
        x = self.wte(idx) + self.wpe(pos)                        # (B,T,C)
        x = F.dropout(x, self.cfg.dropout, self.training)
        for block in self.h:
            x = block(x)                                         # (B,T,C)
        return self.head(self.ln_f(x))                           # (B,T,V)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(idx)                                       # (B,T,V)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description="self-check of the Python reference GPT")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = GptConfig(vocab=args.vocab, seq_len=args.seq, layers=args.layers, dim=args.dim,
                    heads=args.heads)
    model = Gpt(cfg, args.seed)
    n = model.num_parameters()
    assert n == cfg.num_parameters(), (n, cfg.num_parameters())
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    loss = model.loss(idx, idx.roll(-1, dims=1)).item()
    print(f"parameters {n}")
    print(f"initial loss {loss:.4f} (ln V = {math.log(cfg.vocab):.4f})")


if __name__ == "__main__":
    main()
