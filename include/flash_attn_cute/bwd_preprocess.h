// The two small kernels around the backward mainloop: D = rowsum(dO * O) before it, and the fp32
// dQ accumulator -> dQ (scaled, in the input dtype) after it. Both are memory-bound row walks
// (row_walk.h).
#pragma once

#include <cuda_runtime.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "block_info.h"
#include "params.h"
#include "row_walk.h"

namespace flash_attn_cute {

// grid (ceil_div(seqlen_q, kRowsPerCta), batch, heads)
template <class Element>
__global__ void __launch_bounds__(RowWalk::kThreads) bwd_dot_do_o_kernel(__grid_constant__ const BwdParams params) {
  const RowWalk walk;
  const int bidb = blockIdx.y, bidh = blockIdx.z;
  const BlockInfo binfo(params, bidb);
  if (walk.row >= binfo.seqlen_q) return;  // whole row groups leave together: the shuffles stay full
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

// grid (ceil_div(seqlen_q, kRowsPerCta), batch, heads): dQ = score_scale * dq_accum, for tiles added
// row by row (the bulk reductions; atomics add in fragment order: bwd_epilogue.h).
template <class Element>
__global__ void __launch_bounds__(RowWalk::kThreads) bwd_convert_dq_kernel(__grid_constant__ const BwdParams params) {
  const RowWalk walk;
  const int bidb = blockIdx.y, bidh = blockIdx.z;
  const BlockInfo binfo(params, bidb);
  if (walk.row >= binfo.seqlen_q) return;
  float const* accum_row =
      params.dq_accum_ptr + binfo.dq_accum_offset(params, bidb, bidh) + walk.row * params.dq_accum_row_stride;
  Element* dq_row = static_cast<Element*>(params.dq.ptr) + binfo.q_offset(params.dq, bidb, bidh) +
                    index_t(walk.row) * params.dq.row_stride;
  for (int col = walk.lane * RowWalk::kElemsPerVector; col < params.head_dim;
       col += RowWalk::kThreadsPerRow * RowWalk::kElemsPerVector) {
    AlignedVector<float> acc = *reinterpret_cast<AlignedVector<float> const*>(accum_row + col);
#pragma unroll
    for (int i = 0; i < RowWalk::kElemsPerVector; ++i) acc[i] *= params.score_scale;
    AlignedVector<Element> out;
    static_cast<cutlass::Array<Element, RowWalk::kElemsPerVector>&>(out) =
        cutlass::NumericArrayConverter<Element, float, RowWalk::kElemsPerVector>{}(acc);
    *reinterpret_cast<AlignedVector<Element>*>(dq_row + col) = out;
  }
}

}  // namespace flash_attn_cute
