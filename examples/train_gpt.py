#!/usr/bin/env python
"""Trains a small byte-level GPT twice, once with flash_attn_cute and once with torch SDPA, from the
same initial weights on the same batches, and checks that the two loss curves agree.

The text is this repository's own sources (README, Python, C++/CUDA headers): shipped data, no
download. The model uses grouped-query attention (8 query heads, 2 KV heads, head dim 64) in bf16
autocast, so the run exercises the forward, the backward and the GQA reduction of dK / dV.

  python examples/train_gpt.py                     # 300 steps each, prints both curves
  python examples/train_gpt.py --steps 500 --out curves   # also writes curves.csv (and curves.png)
"""
import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from flash_attn_cute import flash_attn_func

ROOT = Path(__file__).resolve().parent.parent


def corpus_bytes():
    files = sorted(p for pattern in ("*.md", "**/*.py", "include/**/*.h") for p in ROOT.glob(pattern)
                   if not {".git", "build", ".prebuilt"} & set(p.parts))
    return torch.tensor(list(b"\n".join(p.read_bytes() for p in files)), dtype=torch.long)


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, backend):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.qkv = nn.Linear(dim, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.backend = backend

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim,
                                     self.n_kv_heads * self.head_dim], dim=-1)
        q = q.view(b, s, self.n_heads, self.head_dim)
        k = k.view(b, s, self.n_kv_heads, self.head_dim)
        v = v.view(b, s, self.n_kv_heads, self.head_dim)
        if self.backend == "flash_attn_cute":
            out = flash_attn_func(q, k, v, causal=True)  # (b, s, h, d) in, (b, s, h, d) out
        else:
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, enable_gqa=True).transpose(1, 2)
        return self.proj(out.reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, backend):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, n_heads, n_kv_heads, backend)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, backend, vocab=256, dim=512, depth=4, n_heads=8, n_kv_heads=2, seqlen=512):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seqlen, dim)
        self.blocks = nn.ModuleList(Block(dim, n_heads, n_kv_heads, backend) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train(backend, data, args):
    torch.manual_seed(args.seed)  # same initial weights for both backends
    model = GPT(backend, seqlen=args.seqlen).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    batches = torch.Generator().manual_seed(args.seed + 1)  # same batches for both backends
    losses, start = [], None
    for step in range(args.steps):
        if step == 10:  # time the steady state
            torch.cuda.synchronize()
            start = time.perf_counter()
        offsets = torch.randint(0, data.numel() - args.seqlen - 1, (args.batch,), generator=batches)
        chunk = torch.stack([data[o:o + args.seqlen + 1] for o in offsets.tolist()]).cuda()
        lr = args.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    ms_per_step = (time.perf_counter() - start) * 1e3 / (args.steps - 10)
    return losses, ms_per_step


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="largest allowed |loss difference|, averaged over the last 50 steps")
    p.add_argument("--out", metavar="PREFIX", help="write PREFIX.csv (and PREFIX.png with matplotlib)")
    args = p.parse_args()
    if args.steps <= 60:
        p.error("--steps must be above 60")

    data = corpus_bytes()
    print(f"corpus: {data.numel()} bytes of this repository's sources")
    curves, speed = {}, {}
    for backend in ("flash_attn_cute", "torch_sdpa"):
        curves[backend], speed[backend] = train(backend, data, args)
        print(f"{backend}: first loss {curves[backend][0]:.3f}, last {curves[backend][-1]:.3f}, "
              f"{speed[backend]:.1f} ms/step")
    a, b = curves["flash_attn_cute"], curves["torch_sdpa"]
    for step in list(range(0, args.steps, max(1, args.steps // 10))) + [args.steps - 1]:
        print(f"step {step:4d}: flash_attn_cute {a[step]:.4f}  torch_sdpa {b[step]:.4f}  diff {a[step] - b[step]:+.4f}")
    tail_diff = sum(abs(x - y) for x, y in zip(a[-50:], b[-50:])) / 50
    learned = a[-1] < 0.5 * a[0]
    print(f"mean |loss difference| over the last 50 steps: {tail_diff:.4f} (tolerance {args.tolerance}); "
          f"loss fell from {a[0]:.3f} to {a[-1]:.3f}")
    if args.out:
        with open(args.out + ".csv", "w") as f:
            f.write("step,flash_attn_cute,torch_sdpa\n")
            f.writelines(f"{i},{x:.5f},{y:.5f}\n" for i, (x, y) in enumerate(zip(a, b)))
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(7, 4))
            ax.plot(a, label=f"flash_attn_cute ({speed['flash_attn_cute']:.1f} ms/step)")
            ax.plot(b, label=f"torch SDPA ({speed['torch_sdpa']:.1f} ms/step)", linestyle="--")
            ax.set(xlabel="step", ylabel="training loss", title="byte-level GPT on this repository's sources")
            ax.legend()
            fig.tight_layout()
            fig.savefig(args.out + ".png", dpi=120)
        except ImportError:
            pass
    if tail_diff > args.tolerance or not learned:
        sys.exit("FAIL: the curves disagree" if learned else "FAIL: the model did not learn")
    print("OK: the two loss curves agree")


if __name__ == "__main__":
    main()
