// The backward's two ways out: the dQ tiles added into the fp32 accumulator (in a fixed order of
// key blocks when deterministic) and their conversion to dQ; and the dK / dV tiles written once at
// the end of a CTA.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "block_info.h"
#include "bwd_api.h"
#include "bwd_kernel_traits.h"  // DqHandOn
#include "bwd_preprocess.h"
#include "launch.h"
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

// Four (a 16-byte aligned group of the dQ tile's fragment order, vec 4), sm_90 only.
__device__ __forceinline__ void atomic_add_quad(float* ptr, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
  atomic_add_pair(ptr, a, b);
  atomic_add_pair(ptr + 2, c, d);
#endif
}

__device__ __forceinline__ int load_acquire(int const* ptr) {
  int value;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(value) : "l"(ptr) : "memory");
  return value;
}

__device__ __forceinline__ void store_release(int* ptr, int value) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(ptr), "r"(value) : "memory");
}

// Adds a CTA's (kBlockM, kHeadDim) dQ tiles into the fp32 accumulator, one per query row block,
// whose rows are contiguous (a row block owns a tile of kBlockM * kHeadDim floats, bwd_api.h), with
// atomics, two floats per thread and instruction, in fragment order: the tile holds pair i of
// thread t's fragment at floats 2 (i kThreads + t), so each warp's reduction covers 256 contiguous
// bytes (two cache lines, where the MMA layout's rows would touch eight; kVec 4, the Hopper backward
// at head dim 256: four floats, 512 bytes), and bwd_convert_dq_fragments_kernel reads the tile back
// in that order. (Measured on H200, bf16 backward vs FA2: 1.10x and 1.15x at head dims 64 and 128,
// against 1.02x and 1.10x with one sm_90 bulk reduction per warp from a shared-memory staging tile;
// 1.06x at 256, against 0.92x with the atomics in the MMA layout's rows.)
// Deterministic (a counter per (batch, head, row block) that holds the key block whose turn it is,
// block_info.h): thread 0 reads the row block's counter at the start of the step (poll_turn), so
// that only its warp stalls on the round trip to memory while the other warps compute, and waits
// for the turn (wait_turn) only if it had not come yet, at the last barrier before the add (which
// orders the wait before every thread's additions); waiting at the start of the step would make
// each key block trail the one it waits for by a hand-on, and the last of a chain of them trail by
// all. The turn is handed on at the next barrier after the add, when every thread's additions are
// done, so that no thread waits for its own. The counters live in shared memory (thread 0 writes
// and reads them): registers are what the backward is short of, and the order costs none in the
// main loop.
template <int kBlockM, int kHeadDim, int kNWarps, int kVec_ = 2>
struct DqAccumulator {
  static constexpr int kThreads = 32 * kNWarps;
  static constexpr int kVec = kVec_;  // values a group of the order (dq_fragment_offset)
  static_assert(kVec == 2 || kVec == 4);
  DqHandOn* hand_on;  // in shared memory

  // Before the first barrier. next: the key block each of this CTA's tiles hands the turn to.
  __device__ __forceinline__ void init(int next) {
    if (threadIdx.x == 0) *hand_on = DqHandOn{nullptr, 0, next, nullptr};
  }

  // semaphore: nullptr, or the row block's counter, which reads n_block when this CTA's tile is
  // next. After the barrier that handed on the previous tile.
  __device__ __forceinline__ void poll_turn(int* semaphore) {
    if (threadIdx.x != 0) return;
    hand_on->turn = semaphore;
    if (semaphore != nullptr) hand_on->seen = load_acquire(semaphore);
  }

  // Before the barrier that precedes add: spins until the counter reads n_block.
  __device__ __forceinline__ void wait_turn(int n_block) {
    if (threadIdx.x != 0 || hand_on->turn == nullptr) return;
    for (int seen = hand_on->seen; seen != n_block; seen = load_acquire(hand_on->turn)) {
    }
  }

  // tdQrdQ: (MMA, MMA_M, MMA_K) accumulator. gdQaccum: the tile's first float, all rows existing
  // (rows past seqlen_q add 0). After wait_turn, then a barrier().
  template <class TensorAcc>
  __device__ __forceinline__ void add(TensorAcc const& tdQrdQ, float* gdQaccum) {
    add_fragment(tdQrdQ, gdQaccum, threadIdx.x);
    if (threadIdx.x == 0) hand_on->pending = hand_on->turn;
  }

  // Adds thread's fragment to the tile with atomics, kVec values an instruction.
  template <class TensorAcc>
  static __device__ __forceinline__ void add_fragment(TensorAcc const& tdQrdQ, float* tile, int thread) {
#pragma unroll
    for (int i = 0; i < size(tdQrdQ); i += kVec) {
      if constexpr (kVec == 2) {
        atomic_add_pair(fragment_group(tile, i, thread), tdQrdQ(i), tdQrdQ(i + 1));
      } else {
        atomic_add_quad(fragment_group(tile, i, thread), tdQrdQ(i), tdQrdQ(i + 1), tdQrdQ(i + 2), tdQrdQ(i + 3));
      }
    }
  }

  // Where the group of values i .. i + kVec - 1 (i a multiple of kVec) of thread's fragment lives in
  // the accumulator tile that starts at tile (thread: of the dQ MMA's kThreads, which may be one
  // warpgroup of a larger CTA). The offset is linear: its constant part, added last, becomes the
  // instruction's immediate offset.
  static __device__ __forceinline__ float* fragment_group(float* tile, int i, int thread) {
    return (tile + dq_fragment_offset(0, thread, kThreads, kVec)) + dq_fragment_offset(i / kVec, 0, kThreads, kVec);
  }

  // A CTA-wide barrier (__syncthreads) that hands on the turn of a tile added before it: every
  // thread's additions happen before thread 0's release store (the barrier orders them, the
  // release is cumulative), so the next key block's CTA sees them all once it sees its turn.
  __device__ __forceinline__ void barrier() {
    __syncthreads();
    if (threadIdx.x == 0 && hand_on->pending != nullptr) {
      store_release(hand_on->pending, hand_on->next);
      hand_on->pending = nullptr;
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

// dQ = ds_scale() * dQ accumulator, from tiles added in fragment order (DqAccumulator). grid
// (ceil_div(seqlen_q, kBlockM), batch, heads), Traits::kDqThreads threads (the dQ MMA's). A thread
// reads 8 consecutive floats of the tile at a time (two 16-byte loads): with pairs (kVec 2), pair i of
// four consecutive threads of the main kernel, starting at a multiple of 4 (a quad), which hold 8
// consecutive columns of one row, starting at a multiple of 8; with groups of 4, group i of two
// threads, starting at an even one, whose values i, i + 1 and i + 2, i + 3 are two columns of two
// rows, the second thread's the next two columns of the same rows (tests/cpp checks both for every
// TiledMmadQ); the dQ MMA partition of the first thread gives the rows and column. Converted, they
// go to a row-major shared tile (rows padded by 16 bytes against bank conflicts), and from there to
// dQ by 16-byte segments, consecutive threads along a row. Measured on H200 (16k tokens, hdim 128,
// 16 heads; 201 MB moved): 57 us, 3.6 TB/s; 115 us with each thread storing the pairs it read back
// (4- or 16-byte stores spread over 8 to 32 rows a warp instruction), as the main kernel's thread
// had added them.
template <class Traits>
__global__ void __launch_bounds__(Traits::kDqThreads)
    bwd_convert_dq_fragments_kernel(__grid_constant__ const BwdParams params) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kThreads = Traits::kDqThreads;
  constexpr int kChunks = kBlockM * kHeadDim / 8;  // of 8 floats, and of 8 elements of dQ
  constexpr int kIters = kChunks / kThreads;
  constexpr int kRowElems = kHeadDim + 8;
  static_assert(kChunks % kThreads == 0 && kThreads % 4 == 0);
  static_assert(kBlockM * kRowElems * sizeof(Element) <= 48 * 1024);
  __shared__ __align__(16) Element sdQ[kBlockM * kRowElems];
  const int m_block = blockIdx.x, bidb = blockIdx.y, bidh = blockIdx.z;
  const BlockInfo binfo(params, bidb);
  const int rows_left = binfo.seqlen_q - m_block * kBlockM;
  if (rows_left <= 0) return;
  float4 const* tile = reinterpret_cast<float4 const*>(params.dq_accum_ptr + binfo.dq_accum_offset(params, bidb, bidh) +
                                                       index_t(m_block) * kBlockM * params.dq_accum_row_stride);
  Element* gdQ = static_cast<Element*>(params.dq.ptr) + binfo.q_offset(params.dq, bidb, bidh) +
                 index_t(m_block) * kBlockM * params.dq.row_stride;
  float4 chunks[kIters][2];
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int chunk = threadIdx.x + k * kThreads;
    chunks[k][0] = tile[2 * chunk];
    chunks[k][1] = tile[2 * chunk + 1];
  }
  // Chunk c = threadIdx.x + k kThreads holds slots 8 c / kVec .. of the order (dq_fragment_offset
  // puts slot group * kThreads + thread at float kVec slot): group 8 c / kVec / kThreads of threads
  // first .. first + 8 / kVec - 1, the first the same for every k.
  constexpr int kVec = Traits::kDqVec;
  constexpr int kSlots = 8 / kVec;  // threads a chunk
  static_assert(dq_fragment_offset(1, 0, kThreads, kVec) == kVec * kThreads &&
                dq_fragment_offset(0, 1, kThreads, kVec) == kVec);
  const int first = kSlots * threadIdx.x % kThreads;
  Tensor tdQcdQ = typename Traits::TiledMmadQ{}.get_thread_slice(first).partition_C(
      make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));  // (MMA, MMA_M, MMA_K)
  const float ds_scale = params.ds_scale();
  constexpr int kN = 16 / kVec;  // consecutive columns of a row in a chunk
  auto store = [&](auto const& rc, cutlass::Array<float, kN> const& in) {  // converted, at (row, col)
    cutlass::AlignedArray<Element, kN> out;
    static_cast<cutlass::Array<Element, kN>&>(out) = cutlass::NumericArrayConverter<Element, float, kN>{}(in);
    *reinterpret_cast<cutlass::AlignedArray<Element, kN>*>(sdQ + get<0>(rc) * kRowElems + get<1>(rc)) = out;
  };
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int group = kSlots * (threadIdx.x + k * kThreads) / kThreads;
    float const* values = reinterpret_cast<float const*>(chunks[k]);
    if constexpr (kVec == 2) {  // 8 columns of a row
      cutlass::Array<float, kN> in;
#pragma unroll
      for (int j = 0; j < 8; ++j) in[j] = values[j] * ds_scale;
      store(tdQcdQ(2 * group), in);
    } else {  // 4 columns of two rows: values 0, 1, 4, 5 and 2, 3, 6, 7
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        cutlass::Array<float, kN> in;
#pragma unroll
        for (int j = 0; j < 4; ++j) in[j] = values[j / 2 * 4 + 2 * r + j % 2] * ds_scale;
        store(tdQcdQ(4 * group + 2 * r), in);
      }
    }
  }
  __syncthreads();
  // head_dim is a multiple of 8 (csrc/glue.cpp): a segment's columns are all inside it or all past it.
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int segment = threadIdx.x + k * kThreads;
    const int row = segment / (kHeadDim / 8), col = segment % (kHeadDim / 8) * 8;
    if (row < rows_left && col < params.head_dim) {
      *reinterpret_cast<uint4*>(gdQ + row * params.dq.row_stride + col) =
          *reinterpret_cast<uint4 const*>(sdQ + row * kRowElems + col);
    }
  }
}

// Both backwards' grids of n_blocks key blocks a sequence (bwd_grid_key_block_major): (KV heads,
// batch, key blocks), or 1-D, in bwd_cta_tile's order, where it fits (INT32_MAX CTAs).
inline cudaError_t bwd_grid(BwdParams const& params, int n_blocks, bool key_block_major, dim3& grid) {
  const int64_t ctas = int64_t(n_blocks) * params.batch * params.heads_k;
  if (!key_block_major && ctas > INT32_MAX) return cudaErrorInvalidConfiguration;
  grid = key_block_major ? dim3(params.heads_k, params.batch, n_blocks) : dim3(unsigned(ctas));
  return cudaSuccess;
}

// Both backwards' launches (Traits: BwdKernelTraits or BwdKernelTraitsSm90): D = rowsum(dO * O)
// (bwd_preprocess.h), the main kernel on `grid` with smem_bytes of dynamic shared memory (its
// arguments: params, then `more`), then dQ from its accumulator, which the caller zeroes first.
template <class Traits, class Kernel, class... More>
cudaError_t launch_bwd_passes(Kernel kernel, dim3 grid, int smem_bytes, BwdParams const& params,
                              cudaStream_t stream, More const&... more) {
  using Element = typename Traits::Element;
  // Where the GPU allows a block less (allow_dynamic_smem; the torch glue names its limit), nothing runs.
  cudaError_t err = allow_dynamic_smem(kernel, smem_bytes, params.device);
  if (err != cudaSuccess) return err;
  err = run_row_kernel(bwd_dot_do_o_kernel<Element, Traits::kBlockM, Traits::kBlockN>, params, stream);
  if (err != cudaSuccess) return err;
  kernel<<<grid, Traits::kNThreads, smem_bytes, stream>>>(params, more...);
  err = cudaPeekAtLastError();
  if (err != cudaSuccess) return err;
  const dim3 convert_grid(ceil_div(params.seqlen_q, Traits::kBlockM), params.batch, params.heads);
  bwd_convert_dq_fragments_kernel<Traits><<<convert_grid, Traits::kDqThreads, 0, stream>>>(params);
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
