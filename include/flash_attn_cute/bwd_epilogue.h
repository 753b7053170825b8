// The backward's two ways out: the dQ tiles added into the fp32 accumulator (in key-block order
// when deterministic) and, for tiles added in fragment order, their conversion to dQ; and the dK /
// dV tiles written once at the end of a CTA.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "block_info.h"
#include "bwd_api.h"
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

// sm_90 bulk copies (PTX ISA 8.0): one instruction moves a whole row between shared and global
// memory, the reduction done by the memory system. Its operands are warp-uniform: when the lanes of
// a warp each issue one, the compiler issues them one lane after another.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, float const* smem, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gmem),
               "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))), "r"(bytes)
               : "memory");
#endif
}

// Closes this thread's bulk copies issued so far into one group (bulk_wait waits for groups).
__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
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

// Makes this thread's ordinary shared memory stores visible to the bulk copies (the async proxy)
// it issues after them.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
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

// Adds a CTA's (kBlockM, kHeadDim) dQ tiles into the fp32 accumulator, one per query row block,
// whose rows are contiguous (dq_accum_row_floats(kHeadDim) floats each, bwd_api.h).
//   kBulk (sm_90): add() stores the tile into sdQ, an image of the accumulator's tile; after the
//     next CTA-wide barrier (sync_then_add()), one lane of every warp adds kBlockM / kNWarps
//     contiguous rows with one bulk reduction. The barrier the step has anyway makes the whole
//     tile visible (measured on H200: faster than one reduction per row, issued by two warps or by
//     every warp, than atomics in the MMA layout's rows, and than each warp adding its own part of
//     the tile; slower than the atomics below: BwdKernelTraits::kDQBulkReduce).
//   Otherwise: add() adds the tile at once with atomics, two floats per thread and instruction, in
//     fragment order: the accumulator tile holds pair i of thread t's fragment at floats
//     2 (i kThreads + t), so each warp's reduction covers 256 contiguous bytes (two cache lines,
//     where the MMA layout's rows would touch eight), and bwd_convert_dq_fragments_kernel reads
//     the tile back the same way.
// Deterministic (a semaphore per (batch, head, row block)): a tile is added once the key blocks
// before it in the row block's order have added theirs, and the turn is handed on at the next
// barrier after, when the additions have completed, so that no thread waits for its own additions.
// The tile's destination and semaphore live in shared memory (thread 0 writes them): registers
// are what the backward is short of.
template <bool kBulk, int kBlockM, int kHeadDim, int kNWarps>
struct DqAccumulator {
  static_assert(kBlockM % kNWarps == 0 && kHeadDim % 32 == 0, "every warp adds the same number of whole rows");
  struct Tile {
    float* dst;      // the tile's first row in the accumulator
    int* semaphore;  // nullptr, or the row block's counter
    int turn;        // this CTA's place in the row block's order
  };
  enum Phase { kNone, kStaged, kAdded };

  static constexpr int kRowFloats = dq_accum_row_floats(kHeadDim);
  static constexpr int kThreads = 32 * kNWarps;
  float* sdQ;      // kBulk: the staged tile, kBlockM x kRowFloats floats
  Tile* tile;      // in shared memory
  Phase phase = kNone;

  // tdQrdQ, tdQcdQ: (MMA, MMA_M, MMA_K) accumulator and its (row, col) coordinates. gdQaccum: the
  // tile's first row, all rows existing (rows past seqlen_q add 0). semaphore, turn: see Tile.
  // A sync_then_release() has passed since the last add (kBulk: sdQ is free).
  template <class TensorAcc, class TensorC>
  __device__ __forceinline__ void add(TensorAcc const& tdQrdQ, TensorC const& tdQcdQ, float* gdQaccum, int* semaphore,
                                      int turn) {
    if constexpr (kBulk) {
      for_each_acc_pair(tdQrdQ, tdQcdQ, [&](int row, int col, float a, float b) {
        *reinterpret_cast<float2*>(sdQ + row * kRowFloats + col) = make_float2(a, b);
      });
      fence_proxy_async_shared();
      if (threadIdx.x == 0) *tile = Tile{gdQaccum, semaphore, turn};
      phase = kStaged;
    } else {
      if (semaphore != nullptr) {
        if (threadIdx.x == 0) wait_for(semaphore, turn);
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < size(tdQrdQ); i += 2) atomic_add_pair(fragment_pair(gdQaccum, i), tdQrdQ(i), tdQrdQ(i + 1));
      if (threadIdx.x == 0) tile->semaphore = semaphore;
      phase = kAdded;
    }
  }

  // Fragment order (without kBulk): where the pair (i, i + 1) (i even) of this thread's fragment
  // lives in the accumulator tile that starts at tile. The offset is linear: its constant part, added
  // last, becomes the instruction's immediate offset.
  static __device__ __forceinline__ float* fragment_pair(float* tile, int i) {
    return (tile + dq_fragment_offset(0, threadIdx.x, kThreads)) + dq_fragment_offset(i / 2, 0, kThreads);
  }

  // The step's first CTA-wide barrier (__syncthreads): after it the staged tile is added (kBulk);
  // an atomically added tile's turn is handed on (see release).
  __device__ __forceinline__ void sync_then_add() {
    if constexpr (kBulk) {
      if (phase == kStaged && threadIdx.x == 0 && tile->semaphore != nullptr) {
        wait_for(tile->semaphore, tile->turn);
        fence_proxy_async_global();  // the earlier key blocks' additions come before ours
      }
    }
    __syncthreads();
    if constexpr (kBulk) {
      if (phase == kStaged) {
        // One lane of every warp issues the warp's rows: with warp-uniform operands (the warp index
        // through a shuffle) they stay in uniform registers, with no per-lane loop around the copy.
        constexpr int kChunk = kBlockM / kNWarps * kRowFloats;  // floats
        const int warp = __shfl_sync(0xffffffff, int(threadIdx.x) / 32, 0);
        if (cute::elect_one_sync()) {
          bulk_reduce_add_f32(tile->dst + warp * kChunk, sdQ + warp * kChunk, kChunk * int(sizeof(float)));
          bulk_commit();
        }
        phase = kAdded;
      }
    } else {
      release();
    }
  }

  // The step's second CTA-wide barrier: the added tile's turn is handed on, and sdQ is free.
  __device__ __forceinline__ void sync_then_release() {
    if constexpr (kBulk) {
      if (phase == kAdded && tile->semaphore != nullptr) {
        bulk_wait<false>();  // the rows are added, not just read
        fence_proxy_async_global();
      } else {
        bulk_wait<true>();
      }
    }
    __syncthreads();
    release();
  }

 private:
  // After a barrier: every thread's additions happen before thread 0's release (the barrier orders
  // them, the fence is cumulative), so the next key block's CTA sees them all once it sees the count.
  __device__ __forceinline__ void release() {
    if (phase == kAdded) {
      if (threadIdx.x == 0 && tile->semaphore != nullptr) {
        __threadfence();
        atomicAdd(tile->semaphore, 1);
      }
      phase = kNone;
    }
  }
};

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

// dQ = score_scale * dQ accumulator, from tiles added in fragment order (DqAccumulator without
// kBulk). grid (ceil_div(seqlen_q, kBlockM), batch, heads), Traits::kNThreads threads: thread t
// reads back the pairs its namesake added in the main kernel and learns their (row, col) from the
// same dQ MMA partition.
template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads)
    bwd_convert_dq_fragments_kernel(__grid_constant__ const BwdParams params) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  using DqAccum = DqAccumulator<false, kBlockM, Traits::kHeadDim, Traits::kNWarps>;
  const int m_block = blockIdx.x, bidb = blockIdx.y, bidh = blockIdx.z;
  const BlockInfo binfo(params, bidb);
  const int rows_left = binfo.seqlen_q - m_block * kBlockM;
  if (rows_left <= 0) return;
  float* tile = params.dq_accum_ptr + binfo.dq_accum_offset(params, bidb, bidh) +
                index_t(m_block) * kBlockM * params.dq_accum_row_stride;
  Element* gdQ = static_cast<Element*>(params.dq.ptr) + binfo.q_offset(params.dq, bidb, bidh) +
                 index_t(m_block) * kBlockM * params.dq.row_stride;
  typename Traits::TiledMmadQ mma_dq;
  auto tile_mk = Shape<Int<kBlockM>, Int<Traits::kHeadDim>>{};
  Tensor tdQcdQ = mma_dq.get_thread_slice(threadIdx.x).partition_C(make_identity_tensor(tile_mk));  // (MMA, MMA_M, MMA_K)
  Tensor acc = partition_fragment_C(mma_dq, tile_mk);                                               // (MMA, MMA_M, MMA_K)
#pragma unroll
  for (int i = 0; i < size(acc); i += 2) {
    const float2 pair = *reinterpret_cast<float2 const*>(DqAccum::fragment_pair(tile, i));
    acc(i) = pair.x * params.score_scale;
    acc(i + 1) = pair.y * params.score_scale;
  }
  for_each_acc_pair(acc, tdQcdQ, [&](int row, int col, float a, float b) {
    if (row < rows_left && col < params.head_dim) {
      cutlass::Array<float, 2> in;
      in[0] = a;
      in[1] = b;
      cutlass::AlignedArray<Element, 2> out;
      static_cast<cutlass::Array<Element, 2>&>(out) = cutlass::NumericArrayConverter<Element, float, 2>{}(in);
      *reinterpret_cast<cutlass::AlignedArray<Element, 2>*>(gdQ + row * params.dq.row_stride + col) = out;
    }
  });
}

}  // namespace flash_attn_cute
