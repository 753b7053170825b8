// The varlen rows that no kernel writes (varlen_rows.h). Its one translation unit, compiled with the
// kernel instantiations (csrc/features.py).
#include <cmath>

#include "flash_attn_cute/varlen_rows.h"

namespace flash_attn_cute {
namespace {

constexpr int kWarps = 8;  // a warp a row

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
