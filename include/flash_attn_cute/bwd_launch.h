// Launches the backward for one (element type, head dim, causal, even-K) instantiation
// (launch_bwd_passes: D = rowsum(dO * O) and the seeds of params.dq_semaphore when deterministic,
// the main kernel, then the fp32 dQ accumulator -> dQ). The caller zeroes params.dq_accum_ptr on the
// same stream first.
#pragma once

#include <cuda_runtime.h>

#include "bwd_api.h"
#include "bwd_kernel.h"
#include "bwd_kernel_traits.h"
#include "kernel_traits.h"
#include "row_walk.h"

namespace flash_attn_cute {

template <class Traits, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t launch_bwd(BwdParams const& params, cudaStream_t stream) {
  dim3 grid;
  const cudaError_t err = bwd_grid(params, ceil_div(params.seqlen_k, Traits::kBlockN),
                                   bwd_grid_key_block_major(kIsCausal, params.deterministic, params.dq_rotate), grid);
  if (err != cudaSuccess) return err;
  return launch_bwd_passes<Traits>(flash_bwd_kernel<Traits, kIsCausal, kIsEvenK, kVariant>, grid, Traits::kSmemBytes,
                                   params, stream);
}

template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_bwd(BwdParams const& params, cudaStream_t stream) {
  return launch_bwd<BwdKernelTraits<kHeadDim, typename ElementOf<kDType>::type>, kIsCausal, kIsEvenK, kVariant>(
      params, stream);
}

// The small tiles (params.small_smem); at head dim 256 without dropout also the V-in-registers one
// (params.v_in_regs).
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_bwd_small(BwdParams const& params, cudaStream_t stream) {
  using Element = typename ElementOf<kDType>::type;
  if constexpr (kHeadDim == 256 && kVariant != Variant::kDropout) {
    if (params.v_in_regs) {
      return launch_bwd<BwdKernelTraits<kHeadDim, Element, true, true>, kIsCausal, kIsEvenK, kVariant>(params, stream);
    }
  }
  return launch_bwd<BwdKernelTraits<kHeadDim, Element, true>, kIsCausal, kIsEvenK, kVariant>(params, stream);
}

}  // namespace flash_attn_cute
