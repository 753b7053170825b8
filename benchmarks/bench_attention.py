#!/usr/bin/env python
"""Benchmark flash_attn_cute against torch SDPA (FA2 and cuDNN backends) on the FA2 grid.

Grid (as in the FlashAttention-2 paper): hdim in {64, 128, 256}, seqlen 512..16384,
batch = 16384 // seqlen, nheads = 2048 // hdim, causal and non-causal.
Timing: triton.testing.do_bench median (warmup=25, rep=100). FLOPs: fwd = 4*b*s^2*h*d
(halved when causal), bwd = 2.5x fwd, fwd_bwd = 3.5x fwd. Examples:
  python benchmarks/bench_attention.py --out benchmarks/results/h200_fwd
  python benchmarks/bench_attention.py --hdims 128 --seqlens 4096,8192 --causal yes --dry-run
"""
import argparse
import contextlib
import math
import sys
from collections import defaultdict
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

PROVIDERS = ("cute", "FA2", "cuDNN")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
FLOPS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
TOTAL_TOKENS, TOTAL_HDIM = 16384, 2048  # batch * seqlen, nheads * hdim
ATOL = 2e-2  # max |cute - FA2| on the forward output before a row is flagged with "!"


def int_list(s):
    return [int(x) for x in s.split(",") if x]


def choice_list(choices):
    def parse(s):
        items = [x for x in s.split(",") if x]
        if not items or any(x not in choices for x in items):
            raise argparse.ArgumentTypeError(f"comma list from {','.join(choices)}, got {s!r}")
        return items
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hdims", type=int_list, default=[64, 128, 256], help="comma list (default: 64,128,256)")
    p.add_argument("--seqlens", type=int_list, default=[512, 1024, 2048, 4096, 8192, 16384],
                   help="comma list (default: 512,...,16384); batch = 16384 // seqlen")
    p.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    p.add_argument("--dtypes", type=choice_list(tuple(DTYPES)), default=["bf16"], help="bf16,fp16 (default: bf16)")
    p.add_argument("--modes", type=choice_list(tuple(FLOPS_FACTOR)), default=["fwd"],
                   help="comma list of fwd,bwd,fwd_bwd (default: fwd)")
    p.add_argument("--group", type=int, default=1,
                   help="query heads per KV head (GQA; 1 = MHA, nheads = MQA); SDPA runs with enable_gqa")
    p.add_argument("--deterministic", action="store_true",
                   help="run cute with deterministic=True (bitwise reproducible dQ)")
    p.add_argument("--out", metavar="PREFIX", help="write <PREFIX>.md (tables) and <PREFIX>.png (chart)")
    p.add_argument("--dry-run", action="store_true", help="print the grid and exit without touching CUDA")
    args = p.parse_args(argv)
    if not args.hdims or any(not 0 < h <= TOTAL_HDIM for h in args.hdims):
        p.error(f"--hdims must be in 1..{TOTAL_HDIM}")
    if not args.seqlens or any(not 0 < s <= TOTAL_TOKENS for s in args.seqlens):
        p.error(f"--seqlens must be in 1..{TOTAL_TOKENS}")
    args.causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    return args


def grid(args, dtype):
    """Yield (hdim, causal, seqlen, batch, nheads) in table order."""
    for hdim in args.hdims:
        for causal in args.causals:
            for seqlen in args.seqlens:
                yield hdim, causal, seqlen, TOTAL_TOKENS // seqlen, TOTAL_HDIM // hdim


def fwd_flops(hdim, causal, seqlen, batch, nheads):
    return 4 * batch * seqlen**2 * nheads * hdim / (2 if causal else 1)


def build_providers(deterministic=False):
    """name -> (fn(q, k, v, causal), context pinning the backend). cute takes (b, s, h, d), SDPA (b, h, s, d)."""
    from flash_attn_cute import flash_attn_func

    def sdpa(q, k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.size(1) != q.size(1))
    def cute(q, k, v, causal):
        return flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    return {"cute": (cute, contextlib.nullcontext),
            "FA2": (sdpa, lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
            "cuDNN": (sdpa, lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION))}


def measure(fn, qkv, dout, mode):
    """Median milliseconds of one `mode` step; bwd/fwd_bwd use autograd.grad with a fixed dout."""
    from triton.testing import do_bench

    def bench(f):
        return do_bench(f, warmup=25, rep=100, return_mode="median")
    if mode == "fwd":
        with torch.no_grad():
            return bench(lambda: fn(*qkv))
    if mode == "bwd":
        out = fn(*qkv)
        return bench(lambda: torch.autograd.grad(out, qkv, dout, retain_graph=True))
    return bench(lambda: torch.autograd.grad(fn(*qkv), qkv, dout))


def run_shape(providers, dtype, shape, modes, notes, group=1):
    """Time every provider and mode on one shape; return ({(mode, name): TFLOP/s or 'n/a'/'n/i'}, maxdiff)."""
    hdim, causal, seqlen, batch, nheads = shape
    q, dout = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=DTYPES[dtype]) for _ in range(2))
    k, v = (torch.randn(batch, seqlen, max(1, nheads // group), hdim, device="cuda", dtype=DTYPES[dtype])
            for _ in range(2))
    bshd = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_())
    bhsd = tuple(t.detach().transpose(1, 2).contiguous().requires_grad_() for t in bshd)
    inputs = {"cute": (bshd, dout), "FA2": (bhsd, dout.transpose(1, 2).contiguous())}
    inputs["cuDNN"] = inputs["FA2"]
    label = f"{dtype} hdim={hdim} causal={causal} seqlen={seqlen}"

    maxdiff, outs = None, {}
    for name in ("cute", "FA2"):  # failures here surface again (and are recorded) when timing
        fn, ctx = providers[name]
        with contextlib.suppress(Exception), ctx(), torch.no_grad():
            outs[name] = fn(*inputs[name][0], causal)
    if len(outs) == 2:
        maxdiff = (outs["cute"].float() - outs["FA2"].float().transpose(1, 2)).abs().max().item()
        if not maxdiff <= ATOL:
            notes[f"! max |cute - FA2| > {ATOL}"].append(f"{label}: {maxdiff:.3g}")
    del outs

    result = {}
    for mode in modes:
        flops = fwd_flops(*shape) * FLOPS_FACTOR[mode]
        for name in PROVIDERS:
            fn, ctx = providers[name]
            qkv, do = inputs[name]
            try:
                with ctx():
                    result[mode, name] = flops / measure(lambda *t: fn(*t, causal), qkv, do, mode) / 1e9
            except Exception as e:
                result[mode, name] = "n/i" if isinstance(e, NotImplementedError) else "n/a"
                msg = (str(e).strip().splitlines() or [""])[0][:160]
                notes[f"{result[mode, name]}: {name} {mode}: {type(e).__name__}: {msg}"].append(label)
            print(f"{label} {mode} {name}: {fmt(result[mode, name])}", file=sys.stderr, flush=True)
    del q, k, v, dout, bshd, bhsd, inputs
    torch.cuda.empty_cache()
    return result, maxdiff


def fmt(x):
    return f"{x:.1f}" if isinstance(x, float) else x


def geomean(xs):
    return f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f}" if xs else "-"


def header_lines(args):
    import flash_attn_cute
    return ["# flash_attn_cute attention benchmark", "",
            f"- date (UTC): {datetime.now(timezone.utc):%Y-%m-%d %H:%M}",
            f"- GPU: {torch.cuda.get_device_name()}",
            f"- torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}",
            f"- flash_attn_cute {getattr(flash_attn_cute, '__version__', '(no __version__)')}",
            "- providers: cute = flash_attn_cute.flash_attn_func"
            + (" with deterministic=True" if args.deterministic else "") + "; FA2 / cuDNN = torch SDPA pinned to "
            "FLASH_ATTENTION / CUDNN_ATTENTION",
            "- timing: triton do_bench median (warmup=25, rep=100); fwd under no_grad; bwd = autograd.grad "
            "with fixed dout (2.5x fwd FLOPs); fwd_bwd = 3.5x fwd FLOPs",
            f"- batch = {TOTAL_TOKENS} // seqlen, nheads = {TOTAL_HDIM} // hdim"
            + (f", {args.group} query heads per KV head" if args.group > 1 else "") + "; n/a = provider failed, "
            f"n/i = NotImplementedError; ! = max |cute - FA2| > {ATOL}", ""]


def table_lines(args, results, maxdiffs, mode, dtype):
    cols = "hdim causal seqlen batch cute_TFLOP/s FA2_TFLOP/s cuDNN_TFLOP/s cute/FA2 cute/cuDNN".split()
    lines = [f"## {mode} {dtype}", "", "| " + " | ".join(cols).replace("_", " ") + " |", "|" + "---:|" * len(cols)]
    ratios = defaultdict(list)  # (ref, hdim or None for overall) -> [cute/ref]
    for shape in grid(args, dtype):
        hdim, causal, seqlen, batch, _ = shape
        r = {name: results[dtype, shape][mode, name] for name in PROVIDERS}
        md = maxdiffs[dtype, shape]
        flag = " !" if md is not None and not md <= ATOL else ""
        row = [hdim, causal, seqlen, batch, fmt(r["cute"]) + flag, fmt(r["FA2"]), fmt(r["cuDNN"])]
        for ref in ("FA2", "cuDNN"):
            if isinstance(r["cute"], float) and isinstance(r[ref], float):
                ratio = r["cute"] / r[ref]
                ratios[ref, None].append(ratio)
                ratios[ref, hdim].append(ratio)
                row.append(f"{ratio:.2f}")
            else:
                row.append("-")
        lines.append("| " + " | ".join(map(str, row)) + " |")
    summary = []
    for ref in ("FA2", "cuDNN"):
        per_hdim = ", ".join(f"hdim {h}: {geomean(ratios[ref, h])}" for h in args.hdims)
        low = f"{min(ratios[ref, None]):.3f}" if ratios[ref, None] else "-"
        summary.append(f"cute/{ref} geomean {geomean(ratios[ref, None])} ({per_hdim}), min {low}")
    return lines + ["", "**Summary:** " + "; ".join(summary), ""]


def plot(args, results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(m, d, h) for m in args.modes for d in args.dtypes for h in args.hdims]
    fig, axes = plt.subplots(len(rows), len(args.causals), squeeze=False,
                             figsize=(6 * len(args.causals), 3.2 * len(rows)))
    xs, width = range(len(args.seqlens)), 0.8 / len(PROVIDERS)
    for (mode, dtype, hdim), ax_row in zip(rows, axes):
        for causal, ax in zip(args.causals, ax_row):
            for i, name in enumerate(PROVIDERS):
                vals = [results[dtype, (hdim, causal, s, TOTAL_TOKENS // s, TOTAL_HDIM // hdim)][mode, name]
                        for s in args.seqlens]
                ax.bar([x + (i - 1) * width for x in xs], [v if isinstance(v, float) else 0 for v in vals],
                       width, label=name)
            ax.set_xticks(list(xs), [str(s) for s in args.seqlens])
            ax.set_title(f"{mode} {dtype} hdim={hdim} {'causal' if causal else 'non-causal'}")
            ax.set(xlabel="seqlen", ylabel="TFLOP/s")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        print(f"modes: {','.join(args.modes)}; providers: {', '.join(PROVIDERS)}")
        print("| dtype | hdim | causal | seqlen | batch | nheads | fwd GFLOP |\n|" + "---:|" * 7)
        for dtype in args.dtypes:
            for shape in grid(args, dtype):
                print(f"| {dtype} | " + " | ".join(map(str, shape)) + f" | {fwd_flops(*shape) / 1e9:.1f} |")
        return

    providers = build_providers(args.deterministic)
    results, maxdiffs, notes = {}, {}, defaultdict(list)
    for dtype in args.dtypes:
        for shape in grid(args, dtype):
            results[dtype, shape], maxdiffs[dtype, shape] = run_shape(providers, dtype, shape, args.modes, notes,
                                                                      args.group)

    lines = header_lines(args)
    for mode in args.modes:
        for dtype in args.dtypes:
            lines += table_lines(args, results, maxdiffs, mode, dtype)
    if notes:
        lines += ["## Notes", ""] + [f"- {note} ({len(where)}x: {'; '.join(where)})" for note, where in notes.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        try:
            plot(args, results, args.out + ".png")
        except ImportError:
            print("matplotlib is not installed; no chart written", file=sys.stderr)


if __name__ == "__main__":
    main()
