// Warpgroup MMA (wgmma, sm_90a) helpers of the Hopper forward (fwd_kernel_sm90.h): the GEMM of one
// warpgroup and the barrier that publishes cp.async copies to it.
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

namespace flash_attn_cute {

using namespace cute;

// acc (+)= A B by one warpgroup MMA per k16 slab, A from shared memory (descriptors) or registers.
// Returns when the MMAs are done (acc is ready, their shared memory free again).
template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorAcc>
__device__ __forceinline__ void wgmma_gemm(TiledMma& tiled_mma, TensorA& tCrA, TensorB const& tCrB, TensorAcc& acc) {
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
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  if constexpr (kARegs) warpgroup_fence_operand(tCrA);
}

// cp.async's shared-memory writes are ordinary ones; the warpgroup MMAs read through the async
// proxy: each thread fences its landed copies before the barrier that publishes them.
__device__ __forceinline__ void wait_copies_and_sync() {
  cp_async_wait<0>();
  cutlass::arch::fence_view_async_shared();
  __syncthreads();
}

}  // namespace flash_attn_cute
