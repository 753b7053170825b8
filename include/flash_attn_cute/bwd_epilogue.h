// The backward's two ways out: one dQ tile added into the fp32 accumulator (atomically, and in
// key-block order when deterministic), and the dK / dV tiles written once at the end of a CTA.
#pragma once

#include <cute/tensor.hpp>

#include "params.h"
#include "utils.h"

namespace flash_attn_cute {

using namespace cute;

// Two adjacent fp32 values added atomically: one vector reduction on sm_90 (red, not atom: no
// value comes back, so the warp does not wait for it).
__device__ __forceinline__ void atomic_add_pair(float* ptr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(ptr), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(ptr, a);
  atomicAdd(ptr + 1, b);
#endif
}

// Spins until *semaphore == value. One thread of the CTA calls it; the others wait at a barrier.
__device__ __forceinline__ void wait_for(int const* semaphore, int value) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(semaphore) : "memory");
  } while (seen != value);
}

// Adds one (kBlockM, kHeadDim) dQ tile into gdQaccum, an fp32 tile of the accumulator with
// row_stride floats between rows, whose rows all exist (rows past seqlen_q add zeros). semaphore: nullptr, or the (batch, head,
// row block) counter that says how many key blocks have added their tile; this CTA's turn is
// n_block. tdQrdQ, tdQcdQ: (MMA, MMA_M, MMA_K) accumulator and its (row, col) coordinates; the
// two values of a thread at MMA index (2i, 2i + 1) are adjacent columns of one row.
template <class TensorAcc, class TensorC>
__device__ __forceinline__ void add_dq_tile(TensorAcc const& tdQrdQ, TensorC const& tdQcdQ, float* gdQaccum,
                                            int row_stride, int* semaphore, int n_block) {
  if (semaphore != nullptr) {
    if (threadIdx.x == 0) wait_for(semaphore, n_block);
    __syncthreads();
  }
  Tensor acc_rc = make_tensor(tdQrdQ.data(), acc_layout_rowcol(tdQrdQ.layout()));  // (rows, cols)
  Tensor coord_rc = make_tensor(tdQcdQ.data(), acc_layout_rowcol(tdQcdQ.layout()));  // (rows, cols) -> (m, k)
#pragma unroll
  for (int mi = 0; mi < size<0>(acc_rc); ++mi) {
    float* row = gdQaccum + get<0>(coord_rc(mi, 0)) * row_stride;
#pragma unroll
    for (int ni = 0; ni < size<1>(acc_rc); ni += 2) {
      atomic_add_pair(row + get<1>(coord_rc(mi, ni)), acc_rc(mi, ni), acc_rc(mi, ni + 1));
    }
  }
  if (semaphore != nullptr) {
    // Every thread's additions happen before thread 0's release (the barrier orders them, the
    // fence is cumulative), so the next key block's CTA sees them all once it sees the count.
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(semaphore, 1);
    }
  }
}

// Writes a (kBlockN, kHeadDim) fp32 accumulator, times scale, to gOut through the shared tile sTmp
// (free for reuse: the caller has synchronised). Rows at or past rows_left and columns at or past
// head_dim are left alone.
template <class Traits, bool Is_even_K, class TiledMma, class TensorAcc, class TensorS, class TensorG>
__device__ __forceinline__ void write_kv_tile(TiledMma const& tiled_mma, TensorAcc& acc, float scale,
                                              TensorS& sTmp, TensorG& gOut, int rows_left, int head_dim,
                                              int tidx) {
  using Element = typename Traits::Element;
#pragma unroll
  for (int i = 0; i < size(acc); ++i) acc(i) *= scale;
  store_tile_via_smem<typename Traits::SmemCopyAtomPdS, typename Traits::GmemTiledCopyOut, Is_even_K>(
      tiled_mma, convert_type<Element>(acc), sTmp, gOut, rows_left, head_dim, tidx);
}

}  // namespace flash_attn_cute
