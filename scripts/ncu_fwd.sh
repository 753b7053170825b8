#!/usr/bin/env bash
# Profiles the forward kernel with Nsight Compute on one shape, plain and with each score mod, to
# see what a feature costs: warp-stall samples per SASS instruction ($OUT/ncu_fwd_source_<hdim>.csv.gz,
# for scripts/sass_stalls.py) and the details page ($OUT/ncu_fwd_<hdim>.txt). Needs an installed
# flash_attn_cute (scripts/gpu_check.sh).
#   usage: bash scripts/ncu_fwd.sh [hdim] [seqlen] [causal 0/1]
set -uo pipefail
OUT=${OUT:-/tmp/flash_attn_cute_out}
hdim=${1:-128} seqlen=${2:-16384} causal=${3:-1}
cat > /tmp/ncu_fwd_case.py <<PY
import torch
import flash_attn_cute as fac
b, s, h, d, causal = 16384 // $seqlen, $seqlen, 2048 // $hdim, $hdim, bool($causal)
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
slopes = torch.rand(h, device="cuda", dtype=torch.float32)
fac.flash_attn_func(q, k, v, causal=causal)
fac.flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes)
fac.flash_attn_func(q, k, v, causal=causal, softcap=30.0)
torch.cuda.synchronize()
PY
ncu --clock-control none -k "regex:flash_fwd_kernel" -c 3 --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats \
    -f -o /tmp/ncu_fwd python3 /tmp/ncu_fwd_case.py > /tmp/ncu_fwd.log 2>&1
tail -3 /tmp/ncu_fwd.log
ncu -i /tmp/ncu_fwd.ncu-rep --page details > "$OUT/ncu_fwd_$hdim.txt"
ncu -i /tmp/ncu_fwd.ncu-rep --page source --csv --print-source sass | gzip > "$OUT/ncu_fwd_source_$hdim.csv.gz"
grep -E "flash_fwd|Duration|Issue Slots Busy|Issued Ipc|Warp Cycles Per Issued|No Eligible" "$OUT/ncu_fwd_$hdim.txt" | cut -c1-120
