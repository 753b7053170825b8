// The split-KV combine kernel: merges the num_splits partial (O, LSE) of every query row into O (in
// the input dtype) and softmax_lse, with the math of split_kv.h's SplitCombine. A memory-bound row
// walk (row_walk.h).
#pragma once

#include <cuda_runtime.h>

#include "block_info.h"
#include "params.h"
#include "row_walk.h"
#include "split_kv.h"

namespace flash_attn_cute {

// grid (ceil_div(seqlen_q, kRowsPerCta), batch, heads). kHeadDim: the split kernel's, the row
// width of oaccum. A template argument because tile_size.h's tables are host data: a device read
// of them is undefined (nvcc compiled fwd_kernel_head_dim here into an endless loop).
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(RowWalk::kThreads) split_combine_kernel(__grid_constant__ const FwdParams params) {
  const RowWalk walk;
  const int bidb = blockIdx.y, bidh = blockIdx.z;
  const BlockInfo binfo(params, bidb);
  if (walk.row >= binfo.seqlen_q) return;
  const index_t row = binfo.lse_offset(params, bidb, bidh) + walk.row;
  float const* lse_of_split = params.lseaccum_ptr + row;  // split s at [s * split_stride]
  SplitCombine combine;
#pragma unroll 8
  for (int s = 0; s < params.num_splits; ++s) combine.add_lse(lse_of_split[s * params.split_stride]);
  if (walk.lane == 0) params.softmax_lse_ptr[row] = combine.lse();

  Element* o_row = static_cast<Element*>(params.o.ptr) + binfo.q_offset(params.o, bidb, bidh) +
                   index_t(walk.row) * params.o.row_stride;
  for (int col = walk.lane * RowWalk::kElemsPerVector; col < params.head_dim;
       col += RowWalk::kThreadsPerRow * RowWalk::kElemsPerVector) {
    AlignedVector<float> acc;
    acc.fill(0.f);
    // No branch on the loaded values, so the loads of many splits are in flight at once: an empty
    // split has weight 0 and wrote O = 0 (write_o_partial writes every split's rows).
#pragma unroll 4
    for (int s = 0; s < params.num_splits; ++s) {
      const float weight = combine.weight(lse_of_split[s * params.split_stride]);
      const AlignedVector<float> part = *reinterpret_cast<AlignedVector<float> const*>(
          params.oaccum_ptr + (s * params.split_stride + row) * kHeadDim + col);
#pragma unroll
      for (int i = 0; i < RowWalk::kElemsPerVector; ++i) acc[i] += weight * part[i];
    }
    AlignedVector<Element> out;
    static_cast<cutlass::Array<Element, RowWalk::kElemsPerVector>&>(out) =
        cutlass::NumericArrayConverter<Element, float, RowWalk::kElemsPerVector>{}(acc);
    *reinterpret_cast<AlignedVector<Element>*>(o_row + col) = out;
  }
}

}  // namespace flash_attn_cute
