// Launches the backward for one (element type, head dim, causal, even-K) instantiation: D =
// rowsum(dO * O), the main kernel, then the fp32 dQ accumulator -> dQ. The caller zeroes
// params.dq_accum_ptr (and params.dq_semaphore when deterministic) on the same stream first.
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
  cudaError_t err = run_row_kernel(bwd_dot_do_o_kernel<Element>, params, stream);
  if (err != cudaSuccess) return err;

  auto kernel = flash_bwd_kernel<Traits, kIsCausal, kIsEvenK, kVariant>;
  // The dQ staging tile (bulk reductions) is used by the sm_90 code only (sm_80 has 164 KB of
  // shared memory), and where it fits. Without it, the dQ tiles are added in fragment order, which
  // the convert kernel undoes. The code that runs was compiled for the virtual architecture
  // ptxVersion (its __CUDA_ARCH__), also when the driver compiled it from PTX for a newer GPU,
  // whose binaryVersion differs.
  cudaFuncAttributes attributes;
  err = cudaFuncGetAttributes(&attributes, kernel);
  if (err != cudaSuccess) return err;
  const bool dq_bulk = attributes.ptxVersion >= 90 && Traits::kDQBulkReduce;
  const int smem_bytes = dq_bulk ? Traits::kSmemBytes : Traits::kSmemTileBytes;
  // Head dim 256 needs more than sm_80's 164 KB: the caller reports it instead of a failed launch.
  int smem_optin = 0;
  err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, params.device);
  if (err != cudaSuccess) return err;
  if (smem_bytes > smem_optin) return cudaErrorLaunchOutOfResources;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  const int n_blocks = ceil_div(params.seqlen_k, Traits::kBlockN);
  const dim3 grid = bwd_grid_key_block_major(kIsCausal, params.deterministic)
                        ? dim3(params.heads_k, params.batch, n_blocks)
                        : dim3(n_blocks, params.batch, params.heads_k);
  kernel<<<grid, Traits::kNThreads, smem_bytes, stream>>>(params);
  err = cudaPeekAtLastError();
  if (err != cudaSuccess) return err;

  if (dq_bulk) return run_row_kernel(bwd_convert_dq_kernel<Element>, params, stream);
  const dim3 convert_grid(ceil_div(params.seqlen_q, Traits::kBlockM), params.batch, params.heads);
  bwd_convert_dq_fragments_kernel<Traits><<<convert_grid, Traits::kNThreads, 0, stream>>>(params);
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
