// Launches the forward kernel for one (element type, head dim, causal) instantiation.
#pragma once

#include <cuda_runtime.h>

#include "combine.h"
#include "fwd_api.h"
#include "fwd_kernel.h"
#include "kernel_traits.h"
#include "launch.h"

namespace flash_attn_cute {

// One launch of the forward kernel, whole (Is_split false) or split-KV.
template <class Traits, bool kIsCausal, bool kIsEvenK, bool kIsSplit, Variant kVariant>
cudaError_t launch_fwd_kernel(FwdParams const& params, cudaStream_t stream) {
  auto kernel = flash_fwd_kernel<Traits, kIsCausal, kIsEvenK, kIsSplit, kVariant>;
  const int warps = kIsSplit ? split_warps(params.num_splits) : 1;  // the split kernel's CTAs: warps x one warp's
  const int smem_bytes = Traits::kSmemBytes * warps;
  const cudaError_t err = allow_dynamic_smem(kernel, smem_bytes, params.device);
  if (err != cudaSuccess) return err;
  const int m_blocks = ceil_div(params.seqlen_q, Traits::kBlockM);
  const dim3 grid(m_blocks * (kIsSplit ? split_ctas(params.num_splits) : 1), params.batch, params.heads);
  if (kIsSplit && split_launch_dependent(params.batch, params.heads_k, params.seqlen_k, params.head_dim,
                                         int(sizeof(typename Traits::Element)))) {
    return launch_dependent(kernel, grid, dim3(Traits::kNThreads * warps), smem_bytes, stream, params);
  }
  kernel<<<grid, Traits::kNThreads * warps, smem_bytes, stream>>>(params);
  return cudaPeekAtLastError();
}

// The split-KV kernel where params.uses_split_kernel(), then the combine when its CTAs hold more
// than one split (params.oaccum_ptr / lseaccum_ptr hold num_splits * split_stride rows, allocated by
// the caller; split_kv.h's split_ctas).
// Dropout (training) never takes the split-KV kernel: its instantiations have none.
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_fwd(FwdParams const& params, cudaStream_t stream) {
  using Element = typename ElementOf<kDType>::type;
  if (!params.uses_split_kernel()) {
    using Traits = FwdKernelTraits<kHeadDim, kIsCausal, Element, false, kVariant>;
    return launch_fwd_kernel<Traits, kIsCausal, kIsEvenK, false, kVariant>(params, stream);
  }
  if constexpr (kVariant == Variant::kDropout) {
    return cudaErrorNotSupported;
  } else {
    using SplitTraits = FwdKernelTraits<kHeadDim, kIsCausal, Element, true>;
    const cudaError_t err = launch_fwd_kernel<SplitTraits, kIsCausal, kIsEvenK, true, kVariant>(params, stream);
    if (err != cudaSuccess || split_ctas(params.num_splits) <= 1) return err;
    return run_split_combine<Element, kHeadDim>(params, stream);
  }
}

template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_fwd_small(FwdParams const& params, cudaStream_t stream) {
  using Traits = FwdKernelTraits<kHeadDim, kIsCausal, typename ElementOf<kDType>::type, false, kVariant, true>;
  return launch_fwd_kernel<Traits, kIsCausal, kIsEvenK, false, kVariant>(params, stream);
}

}  // namespace flash_attn_cute
