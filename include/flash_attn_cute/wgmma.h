// Warpgroup MMA (wgmma, sm_90a) helpers of the Hopper forwards (fwd_kernel_sm90.h,
// fwd_kernel_sm90_ws.h): one warpgroup's GEMM, the barrier that publishes cp.async copies to it, and
// the synchronisation of the warp-specialized kernel (its shared-memory rings and named barriers).
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

namespace flash_attn_cute {

using namespace cute;

// A warpgroup MMA accumulator ((2, 2, N / 8), MMA_M, MMA_N) seen as m16n8 blocks ((2, 2), MMA_M,
// (N / 8, MMA_N)), the layout the dropout mask (dropout.h) is drawn over: the same entries, at the
// same (row, col), so the SM80 backward draws the same mask.
template <class Layout>
__host__ __device__ constexpr auto acc_layout_mma_blocks(Layout acc) {
  static_assert(decltype(rank<0>(acc))::value == 3);
  return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc)), get<1>(acc),
                     make_layout(get<0, 2>(acc), get<2>(acc)));
}

// Issues acc (+)= A B, one warpgroup MMA per k16 slab, A from shared memory (descriptors) or
// registers, as one commit group; warpgroup_mma_done waits for it.
template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorAcc>
__device__ __forceinline__ void wgmma_issue(TiledMma& tiled_mma, TensorA& tCrA, TensorB const& tCrB, TensorAcc& acc) {
  constexpr bool kARegs = !std::is_same_v<typename TensorA::value_type, GmmaDescriptor>;
  if constexpr (kARegs) warpgroup_fence_operand(tCrA);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  tiled_mma.accumulate_ = kZeroInit ? SM90::GMMA::ScaleOut::Zero : SM90::GMMA::ScaleOut::One;
#pragma unroll
  for (int k = 0; k < size<2>(tCrA); ++k) {
    gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
    tiled_mma.accumulate_ = SM90::GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// Waits for every MMA this warpgroup issued but the last kPending batches (wgmma_issue's commit
// groups): the earlier ones' operands are ready, their shared memory free again.
template <int kPending = 0, class... Tensors>
__device__ __forceinline__ void warpgroup_mma_done(Tensors&... operands) {
  warpgroup_wait<kPending>();
  (warpgroup_fence_operand(operands), ...);
}

// acc (+)= A B, returning when the MMAs are done.
template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorAcc>
__device__ __forceinline__ void wgmma_gemm(TiledMma& tiled_mma, TensorA& tCrA, TensorB const& tCrB, TensorAcc& acc) {
  wgmma_issue<kZeroInit>(tiled_mma, tCrA, tCrB, acc);
  constexpr bool kARegs = !std::is_same_v<typename TensorA::value_type, GmmaDescriptor>;
  if constexpr (kARegs) {
    warpgroup_mma_done(acc, tCrA);
  } else {
    warpgroup_mma_done(acc);
  }
}

// cp.async's shared-memory writes are ordinary ones; the warpgroup MMAs read through the async
// proxy: each thread fences its landed copies before the barrier that publishes them. kPending: the
// newest commit groups that may stay in flight.
template <int kPending = 0>
__device__ __forceinline__ void wait_copies_and_sync() {
  cp_async_wait<kPending>();
  cutlass::arch::fence_view_async_shared();
  __syncthreads();
}

// A value every lane of the warp holds alike (read from shared memory, say), made known as such to
// the compiler: what derives from it can live in uniform registers, as from blockIdx.
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

// Named barriers (bar.sync / bar.arrive with a thread count); id 0 is __syncthreads'.
__device__ __forceinline__ void named_barrier_sync(int id, int n_threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n_threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int n_threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n_threads) : "memory");
}
// bar.red.and: whether pred holds in all n_threads threads (all of them, warp-uniform, take it).
__device__ __forceinline__ bool named_barrier_all(int id, int n_threads, bool pred) {
  int all;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.b32 p, %1, 0;\n bar.red.and.pred q, %2, %3, p;\n selp.b32 %0, 1, 0, q;\n}"
      : "=r"(all)
      : "r"(int(pred)), "r"(id), "r"(n_threads)
      : "memory");
  return warp_uniform(all) != 0;
}

// A ring of kStages shared-memory buffers between a producer warpgroup and the consumer
// warpgroups. Use i of the ring (i = 0, 1, ...) fills buffer i % kStages. Producer: acquire(i)
// (the consumers are done with use i - kStages), issue the cp.async copies, commit(i) (the
// buffer's `full` barrier completes when every producer thread's copies have landed). Consumers:
// wait(i), read, release(i). Each barrier's phase flips once per round of the ring.
template <int kStages>
struct SmemRing {
  uint64_t full[kStages];
  uint64_t empty[kStages];

  __device__ void init(int n_producers, int n_consumers) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], n_producers);
      cutlass::arch::ClusterBarrier::init(&empty[s], n_consumers);
    }
  }
  static __device__ int stage(int i) { return i % kStages; }
  static __device__ uint32_t phase(int i) { return uint32_t(i / kStages) & 1u; }
  // A fresh barrier counts its phase before 0 (parity 1) as complete: the first round passes.
  __device__ void acquire(int i) { cutlass::arch::ClusterBarrier::wait(&empty[stage(i)], phase(i) ^ 1u); }
  __device__ void commit(int i) {
    cutlass::arch::cpasync_barrier_arrive(&full[stage(i)]);  // completes when this thread's copies land
    cutlass::arch::ClusterBarrier::arrive(&full[stage(i)]);
  }
  // A TMA producer's commit (one thread): the buffer is full once `bytes` have landed.
  __device__ void commit_tma(int i, uint32_t bytes) {
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage(i)], bytes);
  }
  __device__ uint64_t& full_barrier(int i) { return full[stage(i)]; }
  // cp.async's copies are ordinary shared-memory writes and the MMAs read through the async proxy:
  // with generic_writes the waiting thread fences them (MEMBAR.ALL.CTA and FENCE.VIEW.ASYNC.S in
  // SASS). TMA writes through the async proxy itself: no fence.
  __device__ void wait(int i, bool generic_writes = true) {
    cutlass::arch::ClusterBarrier::wait(&full[stage(i)], phase(i));
    if (generic_writes) cutlass::arch::fence_view_async_shared();
  }
  __device__ void release(int i) { cutlass::arch::ClusterBarrier::arrive(&empty[stage(i)]); }
};

}  // namespace flash_attn_cute
