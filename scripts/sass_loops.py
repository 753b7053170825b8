#!/usr/bin/env python
"""Static opcode counts of each kernel's innermost loops (the SASS between a backward branch and
its target, holding no other such loop), from an object file or a `cuobjdump -sass` listing. Needs
no GPU: compile one instantiation with nvcc -c (the flags of tests/test_kernel_resources.py), then
compare two kernels' main loops, e.g. plain against dropout. A loop's branches inside it are
counted on every path, so the counts bound what one trip issues; the MUFU and HGMMA lines tell
the paths apart. cuobjdump is not in the CPU machine's toolkit; the nvidia-cuda-cuobjdump wheel
carries it (pip download --no-deps nvidia-cuda-cuobjdump, unzip, nvidia/cu13/bin/cuobjdump).

  python scripts/sass_loops.py kernel.o [--kernel ws_kernel] [--loops 3] [--cuobjdump PATH]
"""
import argparse
import collections
import re
import subprocess


def functions(listing):
    """Yields (mangled name, SASS text) of each function of a cuobjdump -sass listing."""
    for part in re.split(r"\n\s*Function : ", listing)[1:]:
        name, body = part.split("\n", 1)
        yield name.strip(), body


def instructions(body):
    """The instructions (without their addresses) and a map from address to index."""
    texts, index = [], {}
    for m in re.finditer(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", body, re.M):
        index[int(m.group(1), 16)] = len(texts)
        texts.append(m.group(2))
    return texts, index


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split(" ")[0]


def innermost_loops(texts, index):
    """(first, last) instruction indices of each backward branch's loop that holds no other."""
    loops = set()
    for i, text in enumerate(texts):
        m = re.search(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)", text)
        if m and index.get(int(m.group(1), 16), i + 1) <= i:
            loops.add((index[int(m.group(1), 16)], i))
    return [l for l in loops if not any(o != l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="an object file (.o, .cubin) or a cuobjdump -sass listing")
    parser.add_argument("--kernel", default="", help="only functions whose mangled name contains this")
    parser.add_argument("--loops", type=int, default=3, help="the largest innermost loops to show per function")
    parser.add_argument("--top", type=int, default=24, help="opcodes to show per loop")
    parser.add_argument("--cuobjdump", default="cuobjdump")
    args = parser.parse_args()
    if args.path.endswith((".o", ".cubin")):
        listing = subprocess.run([args.cuobjdump, "-sass", args.path], check=True, capture_output=True, text=True).stdout
    else:
        listing = open(args.path).read()
    for name, body in functions(listing):
        if args.kernel not in name:
            continue
        texts, index = instructions(body)
        print(f"{name}: {len(texts)} instructions")
        for first, last in sorted(innermost_loops(texts, index), key=lambda l: l[0] - l[1])[:args.loops]:
            counts = collections.Counter(opcode(t) for t in texts[first:last + 1])
            shown = " ".join(f"{op} {n}" for op, n in counts.most_common(args.top))
            print(f"  loop {first}-{last}, {last - first + 1} instructions: {shown}")


if __name__ == "__main__":
    main()
