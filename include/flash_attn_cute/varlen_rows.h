// Varlen rows that no kernel writes. The forward and backward kernels write exactly the rows that
// BlockInfo gives each sequence, rows that see no key (O 0, LSE +inf) and keys that no query sees
// (dK, dV 0) among them. The rest are set here first, on the launch's stream:
// - rows past cu_seqlens[-1], or that the sequences skip;
// - rows past a sequence's max_seqlen cut;
// - in the backward, keys past a sequence's seqused_k.
// This replaces a fill of every row of out and LSE, or of dQ, dK and dV: up to four tensors of
// memset before a varlen training step's kernels.
#pragma once

#include <cuda_runtime.h>

#include "block_info.h"
#include "params.h"

namespace flash_attn_cute {

struct UnwrittenRows {
  static constexpr int kMaxTensors = 2;
  FwdParams params;  // the call's: cu_seqlens, totals, max lengths, seqused_k (BlockInfo)
  // 16-bit elements, params.head_dim of them a head: (total_q, heads, head_dim) out or dQ, and
  // (total_k, heads_k, head_dim) dK and dV.
  TensorView query_rows[kMaxTensors], key_rows[kMaxTensors];
  int n_query_rows = 0, n_key_rows = 0;
  bool lse = false;  // also LSE = +inf on the unwritten query rows (params.softmax_lse_ptr)
};

// Whether the kernels write row `row` of the query side (keys: of the key side): whether it lies in
// the rows BlockInfo gives the last sequence that starts at or before it. With cu_seqlens that do not
// ascend (a caller error) that may be the wrong sequence, and a row some kernel writes is then set
// here first too, which the kernel's write overrides.
FLASH_HOST_DEVICE bool row_written(FwdParams const& params, index_t row, bool keys) {
  const int* cu_seqlens = keys ? params.cu_seqlens_k : params.cu_seqlens_q;
  if (params.batch == 0 || cu_seqlens[0] > row) return false;
  int lo = 0, hi = params.batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const BlockInfo binfo(params, lo);
  const index_t start = keys ? binfo.k_row_start : binfo.q_row_start;
  return row >= start && row < start + (keys ? binfo.seqlen_k : binfo.seqlen_q);
}

// Zeroes rows of the tensors (and sets the LSE) that the call's kernels leave unwritten.
cudaError_t run_unwritten_rows(UnwrittenRows const& rows, cudaStream_t stream);  // csrc/varlen_rows.cu

}  // namespace flash_attn_cute
