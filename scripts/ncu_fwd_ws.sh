#!/usr/bin/env bash
# Nsight Compute on the warp-specialized Hopper forward (flash_fwd_sm90_ws_kernel), one launch per
# row: plain, softcap 30, ALiBi and dropout 0.1 on one shape. Where a feature's time goes: the
# pipes' utilization (MUFU is "xu"), issue slots, the warps' stall reasons. Writes
# $OUT/ncu_ws_<hdim>.csv (the raw metrics, a column per launch) and prints a short table.
#   usage: [PYTHONPATH=<tree>] bash scripts/ncu_fwd_ws.sh [hdim] [seqlen] [causal 0/1]
set -uo pipefail
OUT=${OUT:-/tmp/flash_attn_cute_out}
hdim=${1:-128} seqlen=${2:-16384} causal=${3:-1}
cat > /tmp/ncu_ws_case.py <<PY
import torch
import flash_attn_cute as fac
b, s, h, d, causal = 16384 // $seqlen, $seqlen, 2048 // $hdim, $hdim, bool($causal)
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
slopes = torch.rand(h, device="cuda", dtype=torch.float32) * 0.1
for kw in ({}, {"softcap": 30.0}, {"alibi_slopes": slopes}, {"dropout_p": 0.1}):
    fac.flash_attn_func(q, k, v, causal=causal, **kw)
torch.cuda.synchronize()
PY
ncu --clock-control none -k "regex:flash_fwd_sm90_ws_kernel" -c 4 --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats \
    -f -o /tmp/ncu_ws python3 /tmp/ncu_ws_case.py > /tmp/ncu_ws.log 2>&1
tail -2 /tmp/ncu_ws.log
ncu -i /tmp/ncu_ws.ncu-rep --page raw --csv > "$OUT/ncu_ws_$hdim.csv"
python3 - "$OUT/ncu_ws_$hdim.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
header, launches = rows[0], rows[2:]
want = ("gpu__time_duration.sum", "sm__inst_executed_pipe_", "sm__pipe_", "smsp__issue_active.avg.pct",
        "smsp__average_warps_issue_stalled_", "smsp__inst_executed.sum")
print("| metric | plain | softcap | alibi | dropout |")
print("|---|---|---|---|---|")
for i, name in enumerate(header):
    if not name.startswith(want):
        continue
    values = [launch[i] for launch in launches]
    try:
        if max(float(v.replace(",", "")) for v in values) < 0.05:
            continue  # a pipe or stall reason nobody uses
    except ValueError:
        pass
    print(f"| {name} | " + " | ".join(values) + " |")
PY
