// Maps a runtime (dtype, head dim, causal, score mods) to the instantiation this build compiled,
// for the forward and the backward. The lists come from csrc/features.py.
#include "flash_attn_cute/bwd_api.h"
#include "flash_attn_cute/fwd_api.h"
#include "generated/bwd_instances.h"
#include "generated/fwd_instances.h"

namespace flash_attn_cute {
namespace {

bool matches(FwdParams const& params, DType dtype, int hdim, bool causal, bool even_k, bool mods) {
  const int kernel_head_dim = fwd_kernel_head_dim(params.head_dim);
  return params.dtype == dtype && kernel_head_dim == hdim && params.is_causal == causal &&
         (params.head_dim == kernel_head_dim) == even_k && params.has_score_mods() == mods;
}

}  // namespace

cudaError_t run_fwd_dispatch(FwdParams const& params, cudaStream_t stream) {
#define FLASH_TRY(DT, HDIM, CAUSAL, EVEN_K, MODS)     \
  if (matches(params, DType::DT, HDIM, CAUSAL, EVEN_K, MODS)) \
    return run_fwd<DType::DT, HDIM, CAUSAL, EVEN_K, MODS>(params, stream);
  FLASH_FWD_INSTANCES(FLASH_TRY)
#undef FLASH_TRY
  return cudaErrorNotSupported;
}

cudaError_t run_bwd_dispatch(BwdParams const& params, cudaStream_t stream) {
#define FLASH_TRY(DT, HDIM, CAUSAL, EVEN_K, MODS)     \
  if (matches(params, DType::DT, HDIM, CAUSAL, EVEN_K, MODS)) \
    return run_bwd<DType::DT, HDIM, CAUSAL, EVEN_K, MODS>(params, stream);
  FLASH_BWD_INSTANCES(FLASH_TRY)
#undef FLASH_TRY
  return cudaErrorNotSupported;
}

#define FLASH_BUILT(DT, HDIM, CAUSAL, EVEN_K, MODS) \
  if (dtype == DType::DT && kernel_head_dim == HDIM && has_mods == MODS) return true;
bool fwd_is_built(DType dtype, int kernel_head_dim, bool has_mods) {
  FLASH_FWD_INSTANCES(FLASH_BUILT)
  return false;
}
bool bwd_is_built(DType dtype, int kernel_head_dim, bool has_mods) {
  FLASH_BWD_INSTANCES(FLASH_BUILT)
  return false;
}
#undef FLASH_BUILT

}  // namespace flash_attn_cute
