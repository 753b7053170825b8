// Launches the forward kernel for one (element type, head dim, causal) instantiation.
#pragma once

#include <cuda_runtime.h>

#include "fwd_api.h"
#include "fwd_kernel.h"
#include "kernel_traits.h"

namespace flash_attn_cute {

template <DType kDType>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat16> {
  using type = cutlass::half_t;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
};

template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK>
cudaError_t run_fwd(FwdParams const& params, cudaStream_t stream) {
  using Traits = FwdKernelTraits<kHeadDim, kIsCausal, typename ElementOf<kDType>::type>;
  auto kernel = flash_fwd_kernel<Traits, kIsCausal, kIsEvenK>;
  constexpr int kSmemBytes = Traits::kSmemBytes;
  if (kSmemBytes >= 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(ceil_div(params.seqlen_q, Traits::kBlockM), params.batch, params.heads);
  kernel<<<grid, Traits::kNThreads, kSmemBytes, stream>>>(params);
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
