// The row copy kernel of rotary_copy.h: memory-bound, one thread per 16-byte vector, or per pair of
// vectors that a non-interleaved rotation mixes. Launched by csrc/rotary_copy.cu.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "launch.h"
#include "rotary_copy.h"

namespace flash_attn_cute {

namespace row_copy {

inline constexpr int kThreads = 128;
inline constexpr int kElemsPerVector = 8;

template <class Element>
using Vector = cutlass::AlignedArray<Element, kElemsPerVector>;
using FloatVector = cutlass::Array<float, kElemsPerVector>;

template <class Element>
__device__ __forceinline__ FloatVector load(Element const* ptr) {
  return cutlass::NumericArrayConverter<float, Element, kElemsPerVector>{}(*reinterpret_cast<Vector<Element> const*>(ptr));
}

template <class Element>
__device__ __forceinline__ void store(Element* ptr, FloatVector const& x) {
  Vector<Element> out;
  static_cast<cutlass::Array<Element, kElemsPerVector>&>(out) =
      cutlass::NumericArrayConverter<Element, float, kElemsPerVector>{}(x);
  *reinterpret_cast<Vector<Element>*>(ptr) = out;
}

}  // namespace row_copy

// grid (ceil_div(the largest copy's rows * heads * head_dim / 8, kThreads), batch, copies)
template <class Element>
__global__ void __launch_bounds__(row_copy::kThreads) rotary_copy_kernel(__grid_constant__ const RowCopyParams copies) {
  using namespace row_copy;
  // The attention launched after this kernel (split_launch_dependent) may start now: it waits for
  // this grid's memory before it reads anything.
  allow_dependent_launch();
  RowCopy const& params = copies.copy[blockIdx.z];
  const int b = blockIdx.y;
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (copies.rows_end != nullptr && blockIdx.z == 0 && idx == 0) {
    copies.rows_end[b] = (params.row_base ? params.row_base[b] : 0) + params.rows;
  }
  const int vectors_per_row = copies.head_dim / kElemsPerVector;
  if (idx >= int64_t(params.rows) * params.heads * vectors_per_row) return;
  const int col = int(idx % vectors_per_row) * kElemsPerVector;
  const int h = int(idx / vectors_per_row % params.heads);
  const int i = int(idx / vectors_per_row / params.heads);
  const bool rotate = params.rotary_dim > 0 && col < params.rotary_dim;
  if (rotate && !rotary_vector_is_owner(col, params.rotary_dim, params.interleaved)) return;

  // Where the row goes.
  const int dst_row = (params.row_base ? params.row_base[b] : 0) + i;
  if (dst_row < 0 || dst_row >= params.dst_rows) return;
  index_t dst_offset;
  if (params.block_table) {
    const int page = params.block_table[b * params.block_table_batch_stride + dst_row / params.page_size];
    if (page < 0 || page >= params.dst_batch) return;
    dst_offset = page * params.dst.batch_stride + index_t(dst_row % params.page_size) * params.dst.row_stride;
  } else {
    const int entry = params.dst_batch_idx ? params.dst_batch_idx[b] : b;
    if (entry < 0 || entry >= params.dst_batch) return;
    dst_offset = entry * params.dst.batch_stride + index_t(dst_row) * params.dst.row_stride;
  }
  Element const* src = static_cast<Element const*>(params.src.ptr) + b * params.src.batch_stride +
                       index_t(i) * params.src.row_stride + h * params.src.head_stride;
  Element* dst = static_cast<Element*>(params.dst.ptr) + dst_offset + h * params.dst.head_stride;

  FloatVector x = load(src + col);
  const int pos = (params.pos_base ? params.pos_base[b] : 0) + (params.pos_per_row ? i : 0);
  if (!rotate || pos < 0 || pos >= params.seqlen_ro) {
    store(dst + col, x);
    if (rotate && !params.interleaved) store(dst + col + params.rotary_dim / 2, load(src + col + params.rotary_dim / 2));
    return;
  }
  Element const* cos_row = static_cast<Element const*>(params.cos) + index_t(pos) * (params.rotary_dim / 2);
  Element const* sin_row = static_cast<Element const*>(params.sin) + index_t(pos) * (params.rotary_dim / 2);
  // x, cos and sin are 16-bit floats, so each product below is exact in float32 and only the sum
  // rounds: the rows equal torch's float32 rotation (layers.rotary.apply_rotary_emb) cast to the
  // cache's dtype bit for bit, fused multiply-adds or not (test_kvcache).
  if (params.interleaved) {
    // Pairs (2j, 2j + 1) of this vector use cos / sin entry col / 2 + j.
#pragma unroll
    for (int j = 0; j < kElemsPerVector / 2; ++j) {
      const float c = float(cos_row[col / 2 + j]), s = float(sin_row[col / 2 + j]);
      const float x0 = x[2 * j], x1 = x[2 * j + 1];
      x[2 * j] = x0 * c - x1 * s;
      x[2 * j + 1] = x1 * c + x0 * s;
    }
    store(dst + col, x);
  } else {
    // Element col + j pairs with col + j + rotary_dim / 2; both use cos / sin entry col + j.
    const int half = params.rotary_dim / 2;
    FloatVector y = load(src + col + half);
    const FloatVector c = load(cos_row + col), s = load(sin_row + col);
#pragma unroll
    for (int j = 0; j < kElemsPerVector; ++j) {
      const float x0 = x[j], x1 = y[j];
      x[j] = x0 * c[j] - x1 * s[j];
      y[j] = x1 * c[j] + x0 * s[j];
    }
    store(dst + col, x);
    store(dst + col + half, y);
  }
}

}  // namespace flash_attn_cute
