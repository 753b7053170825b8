#!/usr/bin/env bash
# Profiles a forward kernel with Nsight Compute on one shape, plain and with each feature (softcap
# 30, ALiBi, both, dropout 0.1), to see what a feature costs: the pipes' utilization (MUFU is "xu"),
# issue slots and the warps' stall reasons, printed as a table (all raw metrics in
# $OUT/ncu_fwd_<hdim>.csv, a column per launch), the details page ($OUT/ncu_fwd_<hdim>.txt) and the
# warp-stall samples per SASS instruction ($OUT/ncu_fwd_source_<hdim>.csv.gz, for
# scripts/sass_stalls.py). KERNEL: a regex of the kernel's name (default the SM80 forward; the
# warp-specialized Hopper one is flash_fwd_sm90_ws_kernel). Needs an installed flash_attn_cute
# (scripts/gpu_check.sh) or one on PYTHONPATH (scripts/gpu_trees.sh). NO_DROPOUT=1 leaves the dropout
# case out (builds without the dropout kernels, FLASH_ATTN_CUTE_DROPOUT=0).
#   usage: [KERNEL=flash_fwd_sm90_ws_kernel] [NO_DROPOUT=1] bash scripts/ncu_fwd.sh [hdim] [seqlen] [causal 0/1]
set -uo pipefail
OUT=${OUT:-/tmp/flash_attn_cute_out}
hdim=${1:-128} seqlen=${2:-16384} causal=${3:-1}
cat > /tmp/ncu_fwd_case.py <<PY
import torch
import flash_attn_cute as fac
b, s, h, d, causal = 16384 // $seqlen, $seqlen, 2048 // $hdim, $hdim, bool($causal)
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
slopes = torch.rand(h, device="cuda", dtype=torch.float32) * 0.1
cases = ({}, {"softcap": 30.0}, {"alibi_slopes": slopes}, {"softcap": 30.0, "alibi_slopes": slopes}) + (
    () if ${NO_DROPOUT:-0} else ({"dropout_p": 0.1},))
for kw in cases:
    fac.flash_attn_func(q, k, v, causal=causal, **kw)
torch.cuda.synchronize()
PY
ncu --clock-control none -k "regex:${KERNEL:-flash_fwd_kernel}" -c $((${NO_DROPOUT:-0} ? 4 : 5)) --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats \
    -f -o /tmp/ncu_fwd python3 /tmp/ncu_fwd_case.py > /tmp/ncu_fwd.log 2>&1
tail -3 /tmp/ncu_fwd.log
ncu -i /tmp/ncu_fwd.ncu-rep --page details > "$OUT/ncu_fwd_$hdim.txt"
ncu -i /tmp/ncu_fwd.ncu-rep --page source --csv --print-source sass | gzip > "$OUT/ncu_fwd_source_$hdim.csv.gz"
ncu -i /tmp/ncu_fwd.ncu-rep --page raw --csv > "$OUT/ncu_fwd_$hdim.csv"
python3 - "$OUT/ncu_fwd_$hdim.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
header, launches = rows[0], rows[2:]
want = ("gpu__time_duration.sum", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_xu.avg.pct", "sm__inst_executed_pipe_alu.avg.pct", "sm__inst_executed_pipe_fma.avg.pct",
        "smsp__issue_active.avg.pct", "smsp__inst_executed.sum", "smsp__average_warps_issue_stalled_")
print("| metric | plain | softcap | alibi | softcap+alibi |" + " dropout |" * (len(launches) > 4))
print("|---|---|---|---|---|" + "---|" * (len(launches) > 4))
for i, name in enumerate(header):
    values = [launch[i] for launch in launches]
    numbers = [float(v.replace(",", "")) for v in values if v.replace(",", "").replace(".", "", 1).isdigit()]
    if name.startswith(want) and (not numbers or max(numbers) >= 0.05):  # skip stall reasons nobody has
        print(f"| {name} | " + " | ".join(values) + " |")
PY
