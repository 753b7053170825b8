// The varlen rows that no kernel writes (varlen_rows.h). Its one translation unit, compiled with the
// kernel instantiations (csrc/features.py).
#include <cmath>

#include "flash_attn_cute/varlen_rows.h"

namespace flash_attn_cute {
namespace {

// A thread tests a row; its warp then zeroes the unwritten rows of its 32 together. (A warp a row,
// 4k-8k CTAs over 32k rows, took 19 us a launch on an H100.)
constexpr int kThreads = 256;

// grid (ceil_div(rows, kThreads), 2): blockIdx.y 0 for the query side, 1 for the key side.
__global__ void __launch_bounds__(kThreads) unwritten_rows_kernel(__grid_constant__ const UnwrittenRows rows) {
  FwdParams const& params = rows.params;
  const bool keys = blockIdx.y == 1;
  const index_t total = keys ? params.total_k : params.total_q;
  const index_t first = index_t(blockIdx.x) * kThreads + threadIdx.x / 32 * 32;  // the warp's first row
  if (first >= total) return;  // the whole warp
  const int lane = threadIdx.x % 32;
  const index_t row = first + lane;
  unsigned unwritten = __ballot_sync(0xffffffffu, row < total && !row_written(params, row, keys));
  const int heads = keys ? params.heads_k : params.heads;
  const int vectors = params.head_dim / 8;  // of 16 bytes
  TensorView const* tensors = keys ? rows.key_rows : rows.query_rows;
  const int n_tensors = keys ? rows.n_key_rows : rows.n_query_rows;
  for (; unwritten != 0; unwritten &= unwritten - 1) {
    const index_t r = first + __ffs(unwritten) - 1;
    for (int t = 0; t < n_tensors; ++t) {
      for (int i = lane; i < heads * vectors; i += 32) {
        uint16_t* head = static_cast<uint16_t*>(tensors[t].ptr) + r * tensors[t].row_stride +
                         index_t(i / vectors) * tensors[t].head_stride;
        reinterpret_cast<uint4*>(head)[i % vectors] = make_uint4(0, 0, 0, 0);
      }
    }
    if (!keys && rows.lse) {
      for (int h = lane; h < heads; h += 32) params.softmax_lse_ptr[h * params.lse_head_stride + r] = INFINITY;
    }
  }
}

}  // namespace

cudaError_t run_unwritten_rows(UnwrittenRows const& rows, cudaStream_t stream) {
  const bool keys = rows.n_key_rows > 0;  // (total_k is unread, and may be 0, without)
  const index_t most = keys && rows.params.total_k > rows.params.total_q ? rows.params.total_k : rows.params.total_q;
  if (most == 0) return cudaSuccess;
  const dim3 grid(unsigned((most + kThreads - 1) / kThreads), keys ? 2 : 1);
  unwritten_rows_kernel<<<grid, kThreads, 0, stream>>>(rows);
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
