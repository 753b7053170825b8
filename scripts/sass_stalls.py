#!/usr/bin/env python
"""Sums Nsight Compute's per-instruction warp-stall samples (scripts/ncu_bwd.sh with SOURCE=1) for
each kernel in the export: totals per stall reason, per opcode, and the instructions with the most
samples, so two kernels' main loops can be compared.

  python scripts/sass_stalls.py ncu_bwd_source.csv.gz [--top 25]
"""
import argparse
import collections
import csv
import gzip
import io
import re


def kernels(path):
    """Yields (kernel name, rows as dicts) for each kernel section of the CSV export."""
    text = (gzip.open if path.endswith(".gz") else open)(path, "rt").read()
    for section in re.split(r'^(?="Kernel Name")', text, flags=re.M):
        if not section.strip():
            continue
        first, rest = section.split("\n", 1)
        yield next(csv.reader([first]))[1], list(csv.DictReader(io.StringIO(rest)))


def opcode(source):
    return re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0].split(".")[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    for name, rows in kernels(args.csv):
        samples = sum(int(r["Warp Stall Sampling (All Samples)"]) for r in rows)
        executed = sum(int(r["Instructions Executed"]) for r in rows)
        print(f"\n## {name[:150]}\n{samples} samples, {executed} warp instructions executed")
        reasons = collections.Counter()
        for r in rows:
            for key, value in r.items():
                if key and key.startswith("stall_") and "Not Issued" not in key:
                    reasons[key] += int(value or 0)
        print("reasons:", ", ".join(f"{k[6:]} {100 * v / samples:.1f}%" for k, v in reasons.most_common(10)))
        by_op = collections.Counter()
        ex_op = collections.Counter()
        for r in rows:
            by_op[opcode(r["Source"])] += int(r["Warp Stall Sampling (All Samples)"])
            ex_op[opcode(r["Source"])] += int(r["Instructions Executed"])
        print("opcodes (samples %, executed):",
              ", ".join(f"{k} {100 * v / samples:.1f}% {ex_op[k]}" for k, v in by_op.most_common(14)))
        print(f"top {args.top} instructions (index, samples %, top reasons, source):")
        ranked = sorted(enumerate(rows), key=lambda ir: -int(ir[1]["Warp Stall Sampling (All Samples)"]))
        for i, r in ranked[: args.top]:
            n = int(r["Warp Stall Sampling (All Samples)"])
            top = sorted(((int(v or 0), k[6:]) for k, v in r.items() if k and k.startswith("stall_")
                          and "Not Issued" not in k), reverse=True)[:2]
            print(f"  {i:5d} {100 * n / samples:5.1f}%  {' '.join(f'{k}:{v}' for v, k in top):28s} {r['Source'].strip()[:70]}")


if __name__ == "__main__":
    main()
