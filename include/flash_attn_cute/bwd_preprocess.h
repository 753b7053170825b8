// The backward's preprocessing: D = rowsum(dO * O), a memory-bound row walk (row_walk.h), and the
// seeds of the deterministic dQ order. (The dQ accumulator -> dQ conversion after the main kernel
// reads its tiles in fragment order: bwd_epilogue.h.)
#pragma once

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include "block_info.h"
#include "params.h"
#include "row_walk.h"

namespace flash_attn_cute {

// grid (ceil_div(seqlen_q, kRowsPerCta), batch, heads). kBlockM, kBlockN: the main kernel's tile.
template <class Element, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(RowWalk::kThreads) bwd_dot_do_o_kernel(__grid_constant__ const BwdParams params) {
  const RowWalk walk;
  const int bidb = blockIdx.y, bidh = blockIdx.z;
  const BlockInfo binfo(params, bidb);
  if (walk.row >= binfo.seqlen_q) return;  // whole row groups leave together: the shuffles stay full
  if (params.dq_semaphore != nullptr && walk.row % kBlockM == 0 && walk.lane == 0) {
    // Deterministic: the key block whose dQ tile this query row block takes first (block_info.h).
    // params.window is the main kernel's window: the plain kernels, which fix it at compile time,
    // run only where it is (-1, -1) or (left, 0) (kernel_variant, csrc/glue.cpp).
    const int m_block = walk.row / kBlockM;
    *dq_semaphore_at(params, bidb, bidh, m_block, kBlockM) =
        dq_first_key_block(m_block, kBlockM, kBlockN, binfo.seqlen_q, binfo.seqlen_k, params.window, params.dq_rotate);
  }
  auto row_ptr = [&](TensorView const& t) {
    return static_cast<Element const*>(t.ptr) + binfo.q_offset(t, bidb, bidh) + index_t(walk.row) * t.row_stride;
  };
  Element const* o_row = row_ptr(params.o);
  Element const* do_row = row_ptr(params.dout);
  Element const* res_row = params.o_residual.ptr != nullptr ? row_ptr(params.o_residual) : nullptr;
  float dot = 0.f;
  for (int col = walk.lane * RowWalk::kElemsPerVector; col < params.head_dim;
       col += RowWalk::kThreadsPerRow * RowWalk::kElemsPerVector) {
    Vector16 o = load_as_float(o_row + col);
    if (res_row != nullptr) {  // O's rounding residual (FwdParams::o_residual)
      const Vector16 res = load_as_float(res_row + col);
#pragma unroll
      for (int i = 0; i < RowWalk::kElemsPerVector; ++i) o[i] += res[i];
    }
    const Vector16 dout = load_as_float(do_row + col);
#pragma unroll
    for (int i = 0; i < RowWalk::kElemsPerVector; ++i) dot += o[i] * dout[i];
  }
  const unsigned group_mask = 0xffu << (threadIdx.x % 32 / RowWalk::kThreadsPerRow * RowWalk::kThreadsPerRow);
#pragma unroll
  for (int offset = RowWalk::kThreadsPerRow / 2; offset > 0; offset /= 2) {
    dot += __shfl_xor_sync(group_mask, dot, offset);
  }
  if (walk.lane == 0) params.dsoftmax_sum_ptr[binfo.lse_offset(params, bidb, bidh) + walk.row] = dot;
}

}  // namespace flash_attn_cute
