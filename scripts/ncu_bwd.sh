#!/usr/bin/env bash
# Profiles one backward shape with Nsight Compute: flash_attn_cute's main kernel and torch's FA2
# backward kernel side by side. Needs an installed flash_attn_cute (scripts/gpu_check.sh).
#   usage: bash scripts/ncu_bwd.sh [hdim] [seqlen] [causal 0/1]   (writes $OUT/ncu_bwd.txt)
#   DETERMINISTIC=1: profile flash_attn_cute's deterministic backward (FA2's is the default one).
#   SOURCE=1: instead, the warp-stall samples of every SASS instruction of both kernels
#   ($OUT/ncu_bwd_source_<hdim>.csv.gz; scripts/sass_stalls.py sums them per stall reason and opcode).
set -uo pipefail
OUT=${OUT:-/tmp/flash_attn_cute_out}
hdim=${1:-128} seqlen=${2:-8192} causal=${3:-0} deterministic=${DETERMINISTIC:-0}
cat > /tmp/ncu_bwd_case.py <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import flash_attn_cute as fac
b, s, h, d, causal = 16384 // $seqlen, $seqlen, 2048 // $hdim, $hdim, bool($causal)
q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(4))
out = fac.flash_attn_func(q, k, v, causal=causal, deterministic=bool($deterministic))
torch.autograd.grad(out, (q, k, v), do)
qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o2 = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    torch.autograd.grad(o2, (qt, kt, vt), do.detach().transpose(1, 2).contiguous())
torch.cuda.synchronize()
PY
if [ "${SOURCE:-0}" = 1 ]; then
  ncu --clock-control none -k "regex:flash_bwd_kernel|flash_bwd_sm90_kernel|flash_bwd_dq_dk_dv" -c 2 --section SourceCounters \
      --section WarpStateStats -f -o /tmp/ncu_bwd_source python3 /tmp/ncu_bwd_case.py > /tmp/ncu_bwd_source.log 2>&1
  tail -3 /tmp/ncu_bwd_source.log
  ncu -i /tmp/ncu_bwd_source.ncu-rep --page source --csv --print-source sass | gzip > "$OUT/ncu_bwd_source_$hdim.csv.gz"
  exit 0
fi
ncu --clock-control none -k "regex:flash_bwd_kernel|flash_bwd_sm90_kernel|flash_bwd_dq_dk_dv" -c 2 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
    --section ComputeWorkloadAnalysis --section SourceCounters --section SchedulerStats --section InstructionStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 /tmp/ncu_bwd_case.py > "$OUT/ncu_bwd.txt" 2>&1
grep -E "flash_bwd|Duration|Registers|Throughput|stalled|Bank|Issued|Warp Cycles|Eligible|Active Warps" "$OUT/ncu_bwd.txt" | head -80
