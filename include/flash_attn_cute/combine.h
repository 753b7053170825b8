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

// A row's splits are read in chunks of kChunk, every load of a chunk issued before any is used, so
// that a decode row (mostly at most kChunk splits) costs one round trip to memory. One warp per row
// (lane l holds the float4 columns l, l + 32, ... of it), or several for more splits
// (combine_warps_per_row): they take alternate chunks and merge in shared memory.
template <int kHeadDim>
struct SplitCombineShape {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kVectors = kHeadDim / 4;  // float4 columns of a row
  static constexpr int kVectorsPerLane = ceil_div(kVectors, 32);
  static constexpr int kChunk = 16 / kVectorsPerLane;
  static_assert(kHeadDim % 4 == 0);

  static int warps_per_row(int num_splits) { return combine_warps_per_row(num_splits, kChunk, kWarps); }
};

// Stores four fp32 values of an O row, converted to Element, at its float4 column vec.
template <class Element>
__device__ __forceinline__ void store_vector(Element* row, int vec, cutlass::AlignedArray<float, 4> const& x) {
  using Out = cutlass::AlignedArray<Element, 4>;
  Out out;
  static_cast<cutlass::Array<Element, 4>&>(out) = cutlass::NumericArrayConverter<Element, float, 4>{}(x);
  reinterpret_cast<Out*>(row)[vec] = out;
}

// kHeadDim: the split kernel's, the row width of oaccum (a template argument because tile_size.h's
// tables are host data: a device read of them is undefined; nvcc once compiled one into an endless
// loop here). warps_per_row: SplitCombineShape::warps_per_row(params.num_splits).
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(SplitCombineShape<kHeadDim>::kThreads)
    split_combine_kernel(__grid_constant__ const FwdParams params, int warps_per_row) {
  using Shape = SplitCombineShape<kHeadDim>;
  constexpr int kVectors = Shape::kVectors, kVectorsPerLane = Shape::kVectorsPerLane, kChunk = Shape::kChunk;
  using Vector = cutlass::AlignedArray<float, 4>;
  __shared__ SplitCombine fold_smem[Shape::kWarps];
  __shared__ Vector acc_smem[Shape::kWarps][kVectors];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.x * (Shape::kWarps / warps_per_row) + warp / warps_per_row;
  const int part = warp % warps_per_row;  // this warp's chunks: part, part + warps_per_row, ...
  const int bidb = blockIdx.y, bidh = blockIdx.z;
  wait_for_prior_grid();    // the split kernel's partial results
  allow_dependent_launch();  // the next split kernel (a decode loop's next call) may start
  const BlockInfo binfo(params, bidb);
  const bool has_row = r < binfo.seqlen_q;  // no return: the warps of a row meet at a barrier
  const index_t row = binfo.lse_offset(params, bidb, bidh) + r;
  auto has_vector = [&](int v) { return kVectors % 32 == 0 || lane + 32 * v < kVectors; };

  SplitCombine combine;
  Vector acc[kVectorsPerLane];
#pragma unroll
  for (int v = 0; v < kVectorsPerLane; ++v) acc[v].fill(0.f);
  for (int s0 = part * kChunk; has_row && s0 < params.num_splits; s0 += warps_per_row * kChunk) {
    float lse[kChunk];
    Vector o_part[kChunk][kVectorsPerLane];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const bool valid = s0 + i < params.num_splits;
      const index_t split_row = index_t(s0 + i) * params.split_stride + row;
      lse[i] = valid ? params.lseaccum_ptr[split_row] : -INFINITY;
      Vector const* o_split = reinterpret_cast<Vector const*>(params.oaccum_ptr + split_row * kHeadDim);
#pragma unroll
      for (int v = 0; v < kVectorsPerLane; ++v) {
        if (valid && has_vector(v)) {
          o_part[i][v] = o_split[lane + 32 * v];
        } else {
          o_part[i][v].fill(0.f);
        }
      }
    }
    const float scale = combine.add_chunk(lse);
#pragma unroll
    for (int v = 0; v < kVectorsPerLane; ++v) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[v][e] *= scale;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const float weight = combine.weight(lse[i]);
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[v][e] += weight * o_part[i][v][e];
      }
    }
  }
  if (warps_per_row > 1) {
    if (lane == 0) fold_smem[warp] = combine;
#pragma unroll
    for (int v = 0; v < kVectorsPerLane; ++v) {
      if (has_vector(v)) acc_smem[warp][lane + 32 * v] = acc[v];
    }
    __syncthreads();
    if (part != 0) return;
    for (int w = warp + 1; w < warp + warps_per_row; ++w) {
      const SplitCombine::Scales scales = combine.merge(fold_smem[w]);
#pragma unroll
      for (int v = 0; v < kVectorsPerLane; ++v) {
        if (!has_vector(v)) continue;
        const Vector other = acc_smem[w][lane + 32 * v];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[v][e] = acc[v][e] * scales.self + other[e] * scales.other;
      }
    }
  }
  if (!has_row) return;
  if (lane == 0) params.softmax_lse_ptr[row] = combine.lse();
  Element* o_row = static_cast<Element*>(params.o.ptr) + binfo.q_offset(params.o, bidb, bidh) +
                   index_t(r) * params.o.row_stride;
  const float out_scale = combine.out_scale();
#pragma unroll
  for (int v = 0; v < kVectorsPerLane; ++v) {
    const int vec = lane + 32 * v;
    if (!has_vector(v) || 4 * vec >= params.head_dim) continue;
    Vector o;
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] = acc[v][e] * out_scale;
    store_vector(o_row, vec, o);
  }
}

// The split kernel's CTA whose warps ran the splits of one query row block (split_warps): merges the
// partial (O, LSE) that write_o_partial left in each warp's shared memory (warp i's at smem + i *
// warp_bytes + o_offset and + lse_offset) and writes the block's O and LSE. After a barrier; warp w
// takes rows w, w + warps, ... o: the block's first row of O; lse_out: its first LSE.
template <class Element, int kHeadDim, int kBlockM>
__device__ __forceinline__ void merge_warp_splits(char const* smem, int warp_bytes, int o_offset, int lse_offset,
                                                  int warps, Element* o, index_t o_row_stride, float* lse_out,
                                                  int rows_left, int head_dim) {
  constexpr int kVectors = kHeadDim / 4;  // float4 columns of a row
  using Vector = cutlass::AlignedArray<float, 4>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto part_lse = [&](int i) { return reinterpret_cast<float const*>(smem + i * warp_bytes + lse_offset); };
  auto part_o = [&](int i) { return reinterpret_cast<Vector const*>(smem + i * warp_bytes + o_offset); };
  for (int row = warp; row < kBlockM && row < rows_left; row += warps) {
    float lse[kMaxSplitWarps];
#pragma unroll
    for (int i = 0; i < kMaxSplitWarps; ++i) lse[i] = i < warps ? part_lse(i)[row] : -INFINITY;
    SplitCombine combine;
    combine.add_chunk(lse);
    if (lane == 0) lse_out[row] = combine.lse();
    float weight[kMaxSplitWarps];  // each warp's share of the row, normalised
#pragma unroll
    for (int i = 0; i < kMaxSplitWarps; ++i) weight[i] = combine.weight(lse[i]) * combine.out_scale();
    for (int vec = lane; vec < kVectors && 4 * vec < head_dim; vec += 32) {
      Vector acc;
      acc.fill(0.f);
#pragma unroll
      for (int i = 0; i < kMaxSplitWarps; ++i) {
        if (i >= warps) break;
        const Vector x = part_o(i)[row * kVectors + vec];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] += weight[i] * x[e];
      }
      store_vector(o + row * o_row_stride, vec, acc);
    }
  }
}

// grid (row groups, batch, heads), launched while the split kernel finishes (launch.h).
template <class Element, int kHeadDim>
cudaError_t run_split_combine(FwdParams const& params, cudaStream_t stream) {
  using Shape = SplitCombineShape<kHeadDim>;
  const int warps_per_row = Shape::warps_per_row(params.num_splits);
  const dim3 grid(ceil_div(params.seqlen_q, Shape::kWarps / warps_per_row), params.batch, params.heads);
  return launch_dependent(split_combine_kernel<Element, kHeadDim>, grid, dim3(Shape::kThreads), 0, stream, params,
                          warps_per_row);
}

}  // namespace flash_attn_cute
