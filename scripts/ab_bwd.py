"""Backward A/B in one process: flash_attn_cute's backward on the SM80 kernels
(FLASH_ATTN_CUTE_SM90_BWD=0) against the Hopper ones (unset: the default dispatch), and torch SDPA's
FA2 and cuDNN backends, on bench_attention.py's grid (16k tokens, 2048 / hdim heads). TFLOP/s of
autograd.grad with a fixed dout (bench_attention.measure), medians of triton's do_bench; the
providers' order turns each round. Prints a markdown table. With --kw (flash_attn_func's keyword
arguments as JSON: softcap, window_size, dropout_p; "alibi": true for random slopes) only the two
backwards run. With --deterministic both take deterministic=True, and a third column times the
Hopper one without it.
  usage: python scripts/ab_bwd.py --hdims 32,96 --seqlens 1024,4096,16384 [--mode bwd] [--rounds 2]
"""
import argparse
import contextlib
import json
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_attention import FLOPS_FACTOR, TOTAL_HDIM, TOTAL_TOKENS, build_providers, fwd_flops, measure  # noqa: E402


@contextlib.contextmanager
def sm90_bwd(value):
    """FLASH_ATTN_CUTE_SM90_BWD set to value (None: unset) for the block; the glue reads it every call."""
    old = os.environ.pop("FLASH_ATTN_CUTE_SM90_BWD", None)
    if value is not None:
        os.environ["FLASH_ATTN_CUTE_SM90_BWD"] = value
    try:
        yield
    finally:
        os.environ.pop("FLASH_ATTN_CUTE_SM90_BWD", None)
        if old is not None:
            os.environ["FLASH_ATTN_CUTE_SM90_BWD"] = old


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hdims", default="96")
    p.add_argument("--seqlens", default="1024,4096,16384")
    p.add_argument("--mode", default="bwd", choices=["bwd", "fwd_bwd"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--kw", default="{}", help="flash_attn_func keyword arguments (JSON)")
    p.add_argument("--deterministic", action="store_true", help="sm80 and sm90 deterministic, and sm90 without")
    args = p.parse_args()
    kw = json.loads(args.kw)
    base = build_providers()
    from flash_attn_cute import flash_attn_func

    slopes = {}  # ALiBi's per head count, drawn once (not inside the timed calls)
    mods = {k: tuple(x) if k == "window_size" else x for k, x in kw.items() if k != "alibi"}

    def cute(q, k, v, causal, deterministic=args.deterministic):
        if kw.get("alibi") and q.size(2) not in slopes:
            slopes[q.size(2)] = torch.rand(q.size(2), device="cuda") * 0.3
        return flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes.get(q.size(2)), deterministic=deterministic,
                               **mods)
    providers = {"sm80": (cute, lambda: sm90_bwd("0")), "sm90": (cute, lambda: sm90_bwd(None))}
    columns = ["sm80", "sm90", "FA2", "cuDNN"]
    if args.deterministic:
        providers["sm90 non-det"] = (lambda *a: cute(*a, deterministic=False), lambda: sm90_bwd(None))
        columns.insert(2, "sm90 non-det")
    if not kw:
        providers.update(FA2=base["FA2"], cuDNN=base["cuDNN"])
    det = " deterministic" if args.deterministic else ""
    print(f"# backward A/B ({args.mode}, TFLOP/s, {kw}{det}), {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    extra = " sm90/non-det |" if args.deterministic else ""
    print(f"| hdim | causal | seqlen | {' | '.join(columns)} | sm90/sm80 |{extra} sm90/FA2 | sm90/cuDNN |")
    print("|---:|---:|---:|" + "---|" * len(columns) + "---:|" * (3 + bool(extra)))
    for hdim in (int(h) for h in args.hdims.split(",")):
        for causal in (False, True):
            for seqlen in (int(s) for s in args.seqlens.split(",")):
                batch, nheads = TOTAL_TOKENS // seqlen, TOTAL_HDIM // hdim
                flops = fwd_flops(hdim, causal, seqlen, batch, nheads) * FLOPS_FACTOR[args.mode]
                torch.manual_seed(0)
                q, k, v, dout = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=torch.bfloat16)
                                 for _ in range(4))
                bshd = tuple(t.requires_grad_() for t in (q, k, v))
                bhsd = tuple(t.detach().transpose(1, 2).contiguous().requires_grad_() for t in bshd)
                inputs = {"sm80": (bshd, dout), "sm90": (bshd, dout), "sm90 non-det": (bshd, dout),
                          "FA2": (bhsd, dout.transpose(1, 2).contiguous())}
                inputs["cuDNN"] = inputs["FA2"]
                times = {name: [] for name in providers}
                names = list(providers)
                for r in range(args.rounds):
                    for name in (names if r % 2 == 0 else names[::-1]):
                        fn, ctx = providers[name]
                        qkv, do = inputs[name]
                        try:
                            with ctx():
                                times[name].append(flops / measure(lambda *t: fn(*t, causal), qkv, do, args.mode) / 1e9)
                        except Exception as e:  # noqa: BLE001 - a provider that cannot run the shape
                            print(f"{name} hdim {hdim} causal {causal} seqlen {seqlen}: {e}", file=sys.stderr)
                tf = {n: max(times[n]) if times.get(n) else float("nan") for n in columns}
                cells = " | ".join("/".join(f"{x:.1f}" for x in times.get(n, [])) or "n/a" for n in columns)
                non_det = f" {tf['sm90'] / tf['sm90 non-det']:.2f} |" if args.deterministic else ""
                print(f"| {hdim} | {causal} | {seqlen} | {cells} | {tf['sm90'] / tf['sm80']:.2f} |{non_det} "
                      f"{tf['sm90'] / tf['FA2']:.2f} | {tf['sm90'] / tf['cuDNN']:.2f} |", flush=True)
                del q, k, v, dout, bshd, bhsd, inputs
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
