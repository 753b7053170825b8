// Memory-bound kernels that walk rows: a group of kThreadsPerRow threads owns one (row, head) and
// moves 16-byte vectors of it. Used around the backward mainloop and by the split-KV combine.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "block_info.h"

namespace flash_attn_cute {

struct RowWalk {
  static constexpr int kThreads = 128;
  static constexpr int kThreadsPerRow = 8;
  static constexpr int kRowsPerCta = kThreads / kThreadsPerRow;
  static constexpr int kElemsPerVector = 8;  // 16 bytes of fp16 / bf16

  int row;   // this thread's row in the sequence
  int lane;  // this thread's place in its row group: it takes vectors lane, lane + 8, ...

  __device__ RowWalk() : row(blockIdx.x * kRowsPerCta + threadIdx.x / kThreadsPerRow),
                         lane(threadIdx.x % kThreadsPerRow) {}
};

using Vector16 = cutlass::Array<float, RowWalk::kElemsPerVector>;
// Global memory is read and written through aligned arrays so each vector moves in whole 16-byte
// transactions (plain cutlass::Array only promises element alignment).
template <class T>
using AlignedVector = cutlass::AlignedArray<T, RowWalk::kElemsPerVector>;

template <class Element>
__device__ __forceinline__ Vector16 load_as_float(Element const* ptr) {
  const AlignedVector<Element> in = *reinterpret_cast<AlignedVector<Element> const*>(ptr);
  return cutlass::NumericArrayConverter<float, Element, RowWalk::kElemsPerVector>{}(in);
}

// Launches a row kernel on grid (ceil_div(seqlen_q, kRowsPerCta), batch, heads).
template <class Params>
cudaError_t run_row_kernel(void (*kernel)(Params), Params const& params, cudaStream_t stream) {
  const dim3 grid(ceil_div(params.seqlen_q, RowWalk::kRowsPerCta), params.batch, params.heads);
  kernel<<<grid, RowWalk::kThreads, 0, stream>>>(params);
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
