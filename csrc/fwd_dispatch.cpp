// Maps a runtime (dtype, head dim, causal) to the instantiation this build compiled.
#include "flash_attn_cute/fwd_api.h"
#include "generated/fwd_instances.h"

namespace flash_attn_cute {

cudaError_t run_fwd_dispatch(FwdParams const& params, cudaStream_t stream) {
  const int kernel_head_dim = fwd_kernel_head_dim(params.head_dim);
  const bool is_even_k = params.head_dim == kernel_head_dim;
#define FLASH_FWD_TRY(DT, HDIM, CAUSAL, EVEN_K)                                                  \
  if (params.dtype == DType::DT && kernel_head_dim == HDIM && params.is_causal == CAUSAL && \
      is_even_k == EVEN_K)                                                                     \
    return run_fwd<DType::DT, HDIM, CAUSAL, EVEN_K>(params, stream);
  FLASH_FWD_INSTANCES(FLASH_FWD_TRY)
#undef FLASH_FWD_TRY
  return cudaErrorNotSupported;
}

bool fwd_is_built(DType dtype, int kernel_head_dim) {
#define FLASH_FWD_BUILT(DT, HDIM, CAUSAL, EVEN_K) \
  if (dtype == DType::DT && kernel_head_dim == HDIM) return true;
  FLASH_FWD_INSTANCES(FLASH_FWD_BUILT)
#undef FLASH_FWD_BUILT
  return false;
}

}  // namespace flash_attn_cute
