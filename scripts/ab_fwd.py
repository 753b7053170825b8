#!/usr/bin/env python
"""A / B of the forward across builds of the package (trees): each tree's rows are timed in a
process of its own (triton's do_bench median, L2 flushed), the trees' order alternating from round
to round. A tree is a folder holding a built flash_attn_cute package, as scripts/build_offline_ext.sh
leaves in .offline/. Prints one markdown table: forward ms per round for every (row, tree), and in
brackets the row's speed against the same tree's plain row of that causality (feature cost).

  python scripts/ab_fwd.py --tree M=/tmp/M --tree A=/tmp/A --rounds 2 [--only h128] [--sdpa]
      [--env A:FLASH_ATTN_CUTE_SM90_WS_CONSUMERS=3]

Rows: 16k tokens (batch x seqlen; seqlen 16k but on the 128 / 256 / 1k / 2k rows), 2048 / head dim heads
(head dim 32, 64, 96, 128, 192, 256); softcap 30 (50 and 60 on their own rows: the fixed-offset softmax's bound
lies between them; 100, the largest cap that the listing pass takes; 200, where random scores keep
the checked kernels on the running max), ALiBi slopes rand(heads) x 0.1, dropout 0.1, windows
(1024, 0) and (512, 512) (against full attention: how many times faster). --sdpa adds torch's
FLASH_ATTENTION and CUDNN_ATTENTION backends on the plain rows (timed in the first tree's
process). --backward times forward + backward instead (a gradient for q, k and v; the trees need
the backward built), --backward-only the backward alone (autograd.grad of one forward's output).
--dtype fp16 times every row in float16 instead of bfloat16 (the trees need fp16 built).
--cooldown (seconds, default 1) idles the GPU before each timing: at the board's power limit a row's
clock depends on the load just before it (session 34: without it the plain causal row read 2.0 ms
after the dropout rows, 1.82 ms after 2 s idle, and dropout's cost looked 8 % smaller).
"""
import argparse
import json
import os
import subprocess
import sys
import time

SEQLEN = 16384
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # --dtype: the torch dtype's name
ROWS = {  # name: (head dim, causal, keyword arguments of flash_attn_func; "seqlen": the sequence length)
    "h128 causal": (128, True, {}),
    "h128 full": (128, False, {}),
    "h128 causal softcap": (128, True, {"softcap": 30.0}),
    "h128 full softcap": (128, False, {"softcap": 30.0}),
    "h128 causal softcap50": (128, True, {"softcap": 50.0}),
    "h128 causal softcap60": (128, True, {"softcap": 60.0}),
    "h128 full softcap60": (128, False, {"softcap": 60.0}),
    "h128 causal softcap200": (128, True, {"softcap": 200.0}),
    "h128 causal softcap+alibi": (128, True, {"softcap": 30.0, "alibi": True}),
    "h128 full softcap+alibi": (128, False, {"softcap": 30.0, "alibi": True}),
    "h128 causal softcap60+alibi": (128, True, {"softcap": 60.0, "alibi": True}),
    "h128 full softcap60+alibi": (128, False, {"softcap": 60.0, "alibi": True}),
    "h128 causal softcap100": (128, True, {"softcap": 100.0}),
    "h128 causal softcap60 1k": (128, True, {"softcap": 60.0, "seqlen": 1024}),
    "h128 full dropout+alibi": (128, False, {"dropout_p": 0.1, "alibi": True}),
    "h128 causal alibi": (128, True, {"alibi": True}),
    "h128 full alibi": (128, False, {"alibi": True}),
    "h128 causal dropout": (128, True, {"dropout_p": 0.1}),
    "h128 full dropout": (128, False, {"dropout_p": 0.1}),
    "h128 full window1024": (128, False, {"window_size": (1024, 0)}),
    "h128 full window512+512": (128, False, {"window_size": (512, 512)}),
    "h128 causal 1k": (128, True, {"seqlen": 1024}),
    "h128 full 1k": (128, False, {"seqlen": 1024}),
    "h128 causal 2k": (128, True, {"seqlen": 2048}),
    "h128 full 2k": (128, False, {"seqlen": 2048}),
    "h128 full 128": (128, False, {"seqlen": 128}),  # short rows
    "h128 causal 128": (128, True, {"seqlen": 128}),
    "h128 full 256": (128, False, {"seqlen": 256}),
    "h128 causal 256": (128, True, {"seqlen": 256}),
    "h128 causal 512": (128, True, {"seqlen": 512}),
    "h128 causal softcap 256": (128, True, {"softcap": 30.0, "seqlen": 256}),
    "h128 full dropout 256": (128, False, {"dropout_p": 0.1, "seqlen": 256}),
    "h96 causal": (96, True, {}),
    "h96 full": (96, False, {}),
    "h96 causal softcap": (96, True, {"softcap": 30.0}),
    "h96 full softcap": (96, False, {"softcap": 30.0}),
    "h96 causal 2k": (96, True, {"seqlen": 2048}),
    "h96 full 1k": (96, False, {"seqlen": 1024}),
    "h64 causal": (64, True, {}),
    "h64 full": (64, False, {}),
    "h64 causal softcap": (64, True, {"softcap": 30.0}),
    "h64 full softcap": (64, False, {"softcap": 30.0}),
    "h64 causal alibi": (64, True, {"alibi": True}),
    "h64 full alibi": (64, False, {"alibi": True}),
    "h64 causal softcap+alibi": (64, True, {"softcap": 30.0, "alibi": True}),
    "h64 full softcap+alibi": (64, False, {"softcap": 30.0, "alibi": True}),
    "h64 causal alibi 1k": (64, True, {"alibi": True, "seqlen": 1024}),
    "h64 full alibi 1k": (64, False, {"alibi": True, "seqlen": 1024}),
    "h64 causal dropout": (64, True, {"dropout_p": 0.1}),
    "h64 full dropout": (64, False, {"dropout_p": 0.1}),
    "h64 full dropout 1k": (64, False, {"dropout_p": 0.1, "seqlen": 1024}),
    "h64 causal dropout 2k": (64, True, {"dropout_p": 0.1, "seqlen": 2048}),
    "h64 full window1024": (64, False, {"window_size": (1024, 0)}),
    "h64 full window512+512": (64, False, {"window_size": (512, 512)}),
    "h64 causal 1k": (64, True, {"seqlen": 1024}),
    "h64 full 1k": (64, False, {"seqlen": 1024}),
    "h64 causal 2k": (64, True, {"seqlen": 2048}),
    "h64 full 2k": (64, False, {"seqlen": 2048}),
    "h64 causal 4k": (64, True, {"seqlen": 4096}),
    "h64 full 4k": (64, False, {"seqlen": 4096}),
    "h64 full 512": (64, False, {"seqlen": 512}),
    "h64 causal 512": (64, True, {"seqlen": 512}),
    "h64 full 128": (64, False, {"seqlen": 128}),
    "h64 full 256": (64, False, {"seqlen": 256}),
    "h64 causal 256": (64, True, {"seqlen": 256}),
}
# Every feature at the other head dims, 16k tokens (the bar holds at each of them).
for _hdim in (32, 96, 192, 256):
    for _causal in (True, False):
        for _feature, _kw in (("", {}), (" softcap", {"softcap": 30.0}), (" alibi", {"alibi": True}),
                              (" softcap+alibi", {"softcap": 30.0, "alibi": True}), (" dropout", {"dropout_p": 0.1})):
            ROWS.setdefault(f"h{_hdim} {'causal' if _causal else 'full'}{_feature}", (_hdim, _causal, _kw))
    ROWS.setdefault(f"h{_hdim} full window1024", (_hdim, False, {"window_size": (1024, 0)}))
# Head dim 32's softcap at 4k tokens a sequence too (its backward costs the most there, session 61).
for _causal in (True, False):
    for _feature, _kw in (("", {}), (" softcap", {"softcap": 30.0}),
                          (" softcap+alibi", {"softcap": 30.0, "alibi": True})):
        ROWS.setdefault(f"h32 {'causal' if _causal else 'full'}{_feature} 4k", (32, _causal, {**_kw, "seqlen": 4096}))
# Caps past the fixed offset's bound (Sm90Loops' checked kernels; listed and redone up to 100,
# checked throughout above it) and windows with the score mods, at every head dim: a sweep for
# combinations far slower than plain (session 55 found hdim 256's non-causal cap of 200 with ALiBi
# 20x slower).
for _hdim in (64, 96, 128, 192, 256):
    for _causal in (True, False):
        _kind = "causal" if _causal else "full"
        ROWS.setdefault(f"h{_hdim} {_kind} softcap200", (_hdim, _causal, {"softcap": 200.0}))
        for _cap in (60.0, 200.0):
            ROWS.setdefault(f"h{_hdim} {_kind} softcap{_cap:.0f}+alibi", (_hdim, _causal, {"softcap": _cap, "alibi": True}))
    ROWS.setdefault(f"h{_hdim} full window512+512 softcap+alibi",
                    (_hdim, False, {"window_size": (512, 512), "softcap": 30.0, "alibi": True}))
    ROWS.setdefault(f"h{_hdim} full window1024 softcap200+alibi",
                    (_hdim, False, {"window_size": (1024, 0), "softcap": 200.0, "alibi": True}))


def plain_row(name):
    """The row without features of the same head dim, causality and sequence length."""
    hdim, causal, kw = ROWS[name]
    plain = {"seqlen": kw["seqlen"]} if "seqlen" in kw else {}
    found = [r for r, (h, c, k) in ROWS.items() if h == hdim and c == causal and k == plain]
    if not found:
        sys.exit(f"row {name!r} has no plain row of its head dim, causality and sequence length")
    return found[0]


def worker(tree, rows, sdpa, backward, cooldown, backward_only=False, dtype="bf16"):
    sys.path.insert(0, tree)
    import torch
    import triton.testing

    import flash_attn_cute as fac

    assert fac.__file__.startswith(os.path.abspath(tree)), fac.__file__
    torch_dtype = getattr(torch, DTYPES[dtype])
    torch.manual_seed(0)
    times = {}

    def bench(fn):  # do_bench's median after cooldown seconds idle
        torch.cuda.synchronize()
        time.sleep(cooldown)
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")

    for name in rows:
        hdim, causal, kw = ROWS[name]
        heads = 2048 // hdim
        kw = dict(kw)
        seqlen = kw.pop("seqlen", SEQLEN)
        q, k, v = (torch.randn(SEQLEN // seqlen, seqlen, heads, hdim, device="cuda", dtype=torch_dtype,
                               requires_grad=backward or backward_only) for _ in range(3))
        dout = torch.randn_like(q)

        def timed(attention):  # what to time, for attention() giving the output
            if backward_only:  # one forward; each timed call differentiates its output again
                out = attention()
                return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            if backward:
                return lambda: torch.autograd.grad(attention(), (q, k, v), dout)
            return attention

        if kw.pop("alibi", False):
            kw["alibi_slopes"] = torch.rand(heads, device="cuda") * 0.1
        times[name] = bench(timed(lambda: fac.flash_attn_func(q, k, v, causal=causal, **kw)))
        if sdpa and not kw:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            for label, backend in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                with sdpa_kernel(backend):
                    times[f"{name} [{label}]"] = bench(timed(lambda: torch.nn.functional.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=causal).transpose(1, 2)))
    print(json.dumps(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", default=[], help="NAME=FOLDER (repeat)")
    parser.add_argument("--env", action="append", default=[],
                        help="NAME:VAR=VALUE, an environment variable for tree NAME's process (repeat), e.g. "
                             "one folder as two trees, one of them with FLASH_ATTN_CUTE_SM90_WS_CONSUMERS=3")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="",
                        help="comma-separated prefixes of the rows to time (a prefix ending in $: that row alone)")
    parser.add_argument("--sdpa", action="store_true")
    timed_pass = parser.add_mutually_exclusive_group()
    timed_pass.add_argument("--backward", action="store_true", help="time forward + backward")
    timed_pass.add_argument("--backward-only", action="store_true", help="time the backward alone")
    parser.add_argument("--cooldown", type=float, default=1.0,
                        help="seconds idle before each row: at the board's power limit a row's clock depends on the "
                             "load before it")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="q, k and v's dtype (default bf16)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cooldown < 0:
        parser.error("--cooldown must not be negative")
    if args.worker:
        worker(args.worker, args.rows.split(","), args.sdpa, args.backward, args.cooldown, args.backward_only, args.dtype)
        return
    prefixes = [p for p in args.only.split(",") if p]
    def picked(row, prefix):
        return row == prefix[:-1] if prefix.endswith("$") else row.startswith(prefix)
    rows = [r for r in ROWS if not prefixes or any(picked(r, p) for p in prefixes)]
    rows += sorted({plain_row(r) for r in rows} - set(rows))  # every feature row's plain row
    trees = dict(t.split("=", 1) for t in args.tree)
    envs = {name: dict(os.environ) for name in trees}
    for setting in args.env:
        name, _, assignment = setting.partition(":")
        var, eq, value = assignment.partition("=")
        if name not in trees or not var or not eq:
            parser.error(f"--env {setting!r}: expected NAME:VAR=VALUE with NAME one of the trees")
        envs[name][var] = value
    results = {name: [] for name in trees}  # tree -> [times of each round]
    sdpa = {}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            cmd = [sys.executable, __file__, "--worker", trees[name], "--rows", ",".join(rows)]
            if args.sdpa and name == list(trees)[0]:
                cmd.append("--sdpa")
            if args.backward:
                cmd.append("--backward")
            if args.backward_only:
                cmd.append("--backward-only")
            cmd += ["--cooldown", str(args.cooldown), "--dtype", args.dtype]
            out = subprocess.run(cmd, capture_output=True, text=True, env=envs[name])
            if out.returncode != 0:
                sys.exit(f"tree {name} round {r} failed:\n{out.stderr[-3000:]}")
            times = json.loads(out.stdout.strip().splitlines()[-1])
            for key in [k for k in times if "[" in k]:
                sdpa.setdefault(key, []).append(times.pop(key))
            results[name].append(times)
            print(f"round {r} tree {name}: done", file=sys.stderr, flush=True)
    print("| row | " + " | ".join(trees) + " |")
    print("|---|" + "---|" * len(trees))
    for row in rows:
        cells = []
        for name in trees:
            per_round = []
            for times in results[name]:
                cost = "" if plain_row(row) == row else f" ({times[plain_row(row)] / times[row]:.2f})"
                per_round.append(f"{times[row]:.3f}{cost}")
            cells.append(" / ".join(per_round))
        print(f"| {row} | " + " | ".join(cells) + " |")
    for key, values in sdpa.items():
        print(f"| {key} | " + " / ".join(f"{t:.3f}" for t in values) + " |" + " |" * (len(trees) - 1))


if __name__ == "__main__":
    main()
