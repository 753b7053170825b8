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

// sm_90 bulk copies (PTX ISA 8.0): one instruction moves a whole row between shared and global
// memory, the reduction done by the memory system. Its operands are warp-uniform: when the lanes of
// a warp each issue one, the compiler issues them one lane after another.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, float const* smem, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gmem),
               "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// Orders this thread's global memory accesses through the bulk-copy (async) proxy with its ordinary
// ones: the deterministic dQ order hands over between CTAs through an ordinary semaphore.
__device__ __forceinline__ void fence_proxy_async_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

// Waits until this thread's bulk copies have read their shared memory (Read_only) or completed.
template <bool Read_only>
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (Read_only) {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  } else {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
#endif
}

// add_dq_tile through shared memory: every thread stores its part of the tile into sdQ (kBlockM
// rows of kSmemRowStride floats), then thread r < kBlockM adds row r into the accumulator with one
// bulk reduction: the first kBlockM / 32 warps issue them while the others go on to dK (measured on
// H200: faster than atomics, than each warp adding its own part of the tile, and than lane 0 of
// every warp adding kBlockM / warps rows). The caller guarantees sdQ is free: the previous tile's
// issuers have waited for their reads (bulk_wait<true>) before a barrier that every thread has
// passed since.
template <int kBlockM, int kHeadDim, int kSmemRowStride, class TensorAcc, class TensorC>
__device__ __forceinline__ void add_dq_tile_bulk(TensorAcc const& tdQrdQ, TensorC const& tdQcdQ, float* sdQ,
                                                 float* gdQaccum, int row_stride, int* semaphore, int n_block) {
  Tensor acc_rc = make_tensor(tdQrdQ.data(), acc_layout_rowcol(tdQrdQ.layout()));  // (rows, cols)
  Tensor coord_rc = make_tensor(tdQcdQ.data(), acc_layout_rowcol(tdQcdQ.layout()));  // (rows, cols) -> (m, k)
#pragma unroll
  for (int mi = 0; mi < size<0>(acc_rc); ++mi) {
    float* row = sdQ + get<0>(coord_rc(mi, 0)) * kSmemRowStride;
#pragma unroll
    for (int ni = 0; ni < size<1>(acc_rc); ni += 2) {
      *reinterpret_cast<float2*>(row + get<1>(coord_rc(mi, ni))) = make_float2(acc_rc(mi, ni), acc_rc(mi, ni + 1));
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the stores are visible to the bulk copies
#endif
  if (semaphore != nullptr && threadIdx.x == 0) {
    wait_for(semaphore, n_block);
    fence_proxy_async_global();  // the earlier key blocks' bulk additions come before ours
  }
  __syncthreads();
  if (threadIdx.x < kBlockM) {
    bulk_reduce_add_f32(gdQaccum + threadIdx.x * row_stride, sdQ + threadIdx.x * kSmemRowStride,
                        kHeadDim * int(sizeof(float)));
  }
  if (semaphore != nullptr) {
    if (threadIdx.x < kBlockM) {
      bulk_wait<false>();  // the rows are added, not just read
      fence_proxy_async_global();
    }
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
