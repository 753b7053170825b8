// Launches the backward for one (element type, head dim, causal, even-K) instantiation: D =
// rowsum(dO * O) (and the seeds of params.dq_semaphore when deterministic), the main kernel, then
// the fp32 dQ accumulator -> dQ. The caller zeroes params.dq_accum_ptr on the same stream first.
#pragma once

#include <cuda_runtime.h>

#include "bwd_api.h"
#include "bwd_kernel.h"
#include "bwd_kernel_traits.h"
#include "bwd_preprocess.h"
#include "kernel_traits.h"
#include "row_walk.h"

namespace flash_attn_cute {

template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_bwd(BwdParams const& params, cudaStream_t stream) {
  using Element = typename ElementOf<kDType>::type;
  using Traits = BwdKernelTraits<kHeadDim, Element>;
  cudaError_t err = run_row_kernel(bwd_dot_do_o_kernel<Element, Traits::kBlockM, Traits::kBlockN>, params, stream);
  if (err != cudaSuccess) return err;

  auto kernel = flash_bwd_kernel<Traits, kIsCausal, kIsEvenK, kVariant>;
  // Head dim 256 needs more than sm_80's 164 KB: the caller reports it instead of a failed launch.
  int smem_optin = 0;
  err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, params.device);
  if (err != cudaSuccess) return err;
  if (Traits::kSmemBytes > smem_optin) return cudaErrorLaunchOutOfResources;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int n_blocks = ceil_div(params.seqlen_k, Traits::kBlockN);
  const int64_t ctas = int64_t(n_blocks) * params.batch * params.heads_k;
  const bool key_block_major = bwd_grid_key_block_major(kIsCausal, params.deterministic, params.dq_rotate);
  if (!key_block_major && ctas > INT32_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid = key_block_major ? dim3(params.heads_k, params.batch, n_blocks) : dim3(unsigned(ctas));
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
  err = cudaPeekAtLastError();
  if (err != cudaSuccess) return err;

  const dim3 convert_grid(ceil_div(params.seqlen_q, Traits::kBlockM), params.batch, params.heads);
  bwd_convert_dq_fragments_kernel<Traits><<<convert_grid, Traits::kNThreads, 0, stream>>>(params);
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
