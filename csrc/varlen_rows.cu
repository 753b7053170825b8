// The varlen rows that no kernel writes (varlen_rows.h). Its one translation unit, compiled with the
// kernel instantiations (csrc/features.py).
#include <cmath>

#include "flash_attn_cute/block_info.h"
#include "flash_attn_cute/varlen_rows.h"

namespace flash_attn_cute {
namespace {

constexpr int kWarps = 8;  // a warp a row

// Whether the kernels write row `row` of the query side (keys: of the key side): whether it lies in
// the rows BlockInfo gives the last sequence that starts at or before it. With cu_seqlens that do not
// ascend (a caller error) that may be the wrong sequence, and a row some kernel writes is then set
// here first too, which the kernel's write overrides.
__device__ bool row_written(FwdParams const& params, index_t row, bool keys) {
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

// grid (ceil_div(rows, kWarps), 2): blockIdx.y 0 for the query side, 1 for the key side.
__global__ void __launch_bounds__(kWarps * 32) unwritten_rows_kernel(__grid_constant__ const UnwrittenRows rows) {
  FwdParams const& params = rows.params;
  const bool keys = blockIdx.y == 1;
  const index_t row = index_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= (keys ? params.total_k : params.total_q) || row_written(params, row, keys)) return;
  const int heads = keys ? params.heads_k : params.heads;
  const int vectors = params.head_dim / 8;  // of 16 bytes
  TensorView const* tensors = keys ? rows.key_rows : rows.query_rows;
  for (int t = 0; t < (keys ? rows.n_key_rows : rows.n_query_rows); ++t) {
    for (int i = lane; i < heads * vectors; i += 32) {
      uint16_t* head = static_cast<uint16_t*>(tensors[t].ptr) + row * tensors[t].row_stride +
                       index_t(i / vectors) * tensors[t].head_stride;
      reinterpret_cast<uint4*>(head)[i % vectors] = make_uint4(0, 0, 0, 0);
    }
  }
  if (!keys && rows.lse) {
    for (int h = lane; h < heads; h += 32) params.softmax_lse_ptr[h * params.lse_head_stride + row] = INFINITY;
  }
}

}  // namespace

cudaError_t run_unwritten_rows(UnwrittenRows const& rows, cudaStream_t stream) {
  const bool keys = rows.n_key_rows > 0;  // (total_k is unread, and may be 0, without)
  const index_t most = keys && rows.params.total_k > rows.params.total_q ? rows.params.total_k : rows.params.total_q;
  if (most == 0) return cudaSuccess;
  const dim3 grid(unsigned((most + kWarps - 1) / kWarps), keys ? 2 : 1);
  unwritten_rows_kernel<<<grid, kWarps * 32, 0, stream>>>(rows);
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
