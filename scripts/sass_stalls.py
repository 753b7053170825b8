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


def samples(row):
    return int(row["Warp Stall Sampling (All Samples)"])


def stall_reasons(row):
    """(reason, samples) of one instruction, all samples (issued or not)."""
    return [(key[6:], int(value or 0)) for key, value in row.items()
            if key and key.startswith("stall_") and "Not Issued" not in key]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    for name, rows in kernels(args.csv):
        total = sum(samples(r) for r in rows)
        executed = sum(int(r["Instructions Executed"]) for r in rows)
        print(f"\n## {name[:150]}\n{total} samples, {executed} warp instructions executed")
        reasons = collections.Counter()
        by_op = collections.Counter()
        ex_op = collections.Counter()
        for r in rows:
            for reason, n in stall_reasons(r):
                reasons[reason] += n
            by_op[opcode(r["Source"])] += samples(r)
            ex_op[opcode(r["Source"])] += int(r["Instructions Executed"])
        print("reasons:", ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in reasons.most_common(10)))
        print("opcodes (samples %, executed):",
              ", ".join(f"{k} {100 * v / total:.1f}% {ex_op[k]}" for k, v in by_op.most_common(14)))
        print(f"top {args.top} instructions (index, samples %, top reasons, source):")
        ranked = sorted(enumerate(rows), key=lambda ir: -samples(ir[1]))
        for i, r in ranked[: args.top]:
            top = sorted(stall_reasons(r), key=lambda kv: -kv[1])[:2]
            print(f"  {i:5d} {100 * samples(r) / total:5.1f}%  {' '.join(f'{k}:{v}' for k, v in top):28s} "
                  f"{r['Source'].strip()[:70]}")

if __name__ == "__main__":
    main()
