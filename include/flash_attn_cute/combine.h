// The split-KV combine kernel: merges the num_splits partial (O, LSE) of every query row into O (in
// the input dtype) and softmax_lse, with the math of split_kv.h's SplitCombine.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "block_info.h"
#include "launch.h"
#include "params.h"
#include "split_kv.h"

namespace flash_attn_cute {

// One CTA per (row, batch, head). Decoding has few rows and up to 128 splits each, so one row's
// splits are spread over the CTA's warps and no load waits on another:
//   1. thread s reads split s's LSE into shared memory;
//   2. every warp folds all of them (lane l takes splits l, l + 32, ..., then the lanes merge);
//   3. warp w adds the O of splits w, w + kWarps, ... (4 columns per lane and step; an empty split
//      has weight 0 and wrote O = 0: write_o_partial writes every split's rows);
//   4. the warps' sums meet in shared memory.
struct SplitCombineShape {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static_assert(kThreads >= kMaxSplits, "step 1 reads one LSE per thread");
};

// kHeadDim: the split kernel's, the row width of oaccum (a template argument because tile_size.h's
// tables are host data: a device read of them is undefined; nvcc once compiled one into an endless
// loop here).
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(SplitCombineShape::kThreads)
    split_combine_kernel(__grid_constant__ const FwdParams params) {
  constexpr int kWarps = SplitCombineShape::kWarps;
  constexpr int kVectors = kHeadDim / 4;                  // float4 columns of a row
  constexpr int kVectorsPerLane = ceil_div(kVectors, 32);
  static_assert(kHeadDim % 4 == 0);
  using Vector = cutlass::AlignedArray<float, 4>;
  __shared__ float lse_smem[kMaxSplits];
  __shared__ Vector acc_smem[kWarps][kVectors];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.x, bidb = blockIdx.y, bidh = blockIdx.z;
  wait_for_prior_grid();  // the split kernel's partial results
  const BlockInfo binfo(params, bidb);
  if (r >= binfo.seqlen_q) return;
  const index_t row = binfo.lse_offset(params, bidb, bidh) + r;
  const int num_splits = params.num_splits;

  if (threadIdx.x < num_splits) lse_smem[threadIdx.x] = params.lseaccum_ptr[threadIdx.x * params.split_stride + row];
  __syncthreads();
  SplitCombine combine;
  for (int s = lane; s < num_splits; s += 32) combine.add_lse(lse_smem[s]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    SplitCombine other;
    other.max_lse = __shfl_xor_sync(0xffffffff, combine.max_lse, offset);
    other.sum = __shfl_xor_sync(0xffffffff, combine.sum, offset);
    combine.merge(other);
  }
  if (threadIdx.x == 0) params.softmax_lse_ptr[row] = combine.lse();

  Vector acc[kVectorsPerLane];
#pragma unroll
  for (int v = 0; v < kVectorsPerLane; ++v) acc[v].fill(0.f);
#pragma unroll 8
  for (int s = warp; s < num_splits; s += kWarps) {
    const float weight = combine.weight(lse_smem[s]);
    Vector const* part = reinterpret_cast<Vector const*>(params.oaccum_ptr + (s * params.split_stride + row) * kHeadDim);
#pragma unroll
    for (int v = 0; v < kVectorsPerLane; ++v) {
      if (lane + 32 * v < kVectors) {
        const Vector x = part[lane + 32 * v];
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[v][i] += weight * x[i];
      }
    }
  }
#pragma unroll
  for (int v = 0; v < kVectorsPerLane; ++v) {
    if (lane + 32 * v < kVectors) acc_smem[warp][lane + 32 * v] = acc[v];
  }
  __syncthreads();
  const int vec = threadIdx.x;
  if (vec >= kVectors || 4 * vec >= params.head_dim) return;
  Vector sum;
  sum.fill(0.f);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) sum[i] += acc_smem[w][vec][i];
  }
  using Out = cutlass::AlignedArray<Element, 4>;
  Element* o_row = static_cast<Element*>(params.o.ptr) + binfo.q_offset(params.o, bidb, bidh) +
                   index_t(r) * params.o.row_stride;
  Out out;
  static_cast<cutlass::Array<Element, 4>&>(out) = cutlass::NumericArrayConverter<Element, float, 4>{}(sum);
  reinterpret_cast<Out*>(o_row)[vec] = out;
}

// grid (seqlen_q, batch, heads), launched while the split kernel finishes (launch.h).
template <class Element, int kHeadDim>
cudaError_t run_split_combine(FwdParams const& params, cudaStream_t stream) {
  const dim3 grid(params.seqlen_q, params.batch, params.heads);
  return launch_dependent(split_combine_kernel<Element, kHeadDim>, grid, dim3(SplitCombineShape::kThreads), 0, stream,
                          params);
}

}  // namespace flash_attn_cute
