// Maps a runtime (dtype, head dim, causal, variant) to the instantiation this build compiled,
// for the forward and the backward. The lists come from csrc/features.py.
#include <cstdlib>
#include <string>

#include "flash_attn_cute/bwd_api.h"
#include "flash_attn_cute/fwd_api.h"
#include "generated/bwd_instances.h"
#include "generated/bwd_sm90_instances.h"
#include "generated/fwd_instances.h"
#include "generated/fwd_sm90_instances.h"

namespace flash_attn_cute {
namespace {

bool matches(FwdParams const& params, DType dtype, int hdim, bool causal, bool even_k, Variant variant) {
  const int kernel_head_dim = fwd_kernel_head_dim(params.head_dim);
  return params.dtype == dtype && kernel_head_dim == hdim && params.is_causal == causal &&
         (params.head_dim == kernel_head_dim) == even_k && params.variant() == variant;
}

}  // namespace

cudaError_t run_fwd_dispatch(FwdParams const& params, cudaStream_t stream) {
  if (params.use_sm90 && !params.uses_split_kernel()) {
#define FLASH_TRY_SM90(DT, HDIM, CAUSAL, EVEN_K, VARIANT)                                              \
  if (matches(params, DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT) &&                           \
      (!fwd_sm90_ws_only(HDIM, Variant::VARIANT) || fwd_sm90_takes_ws(params, HDIM, Variant::VARIANT))) \
    return run_fwd_sm90<DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT>(params, stream);
    FLASH_FWD_SM90_INSTANCES(FLASH_TRY_SM90)
#undef FLASH_TRY_SM90
  }
#define FLASH_TRY(DT, HDIM, CAUSAL, EVEN_K, VARIANT)                  \
  if (matches(params, DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT)) \
    return run_fwd<DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT>(params, stream);
  FLASH_FWD_INSTANCES(FLASH_TRY)
#undef FLASH_TRY
  return cudaErrorNotSupported;
}

namespace {

// Whether a non-deterministic backward on compute capability 9.0 takes the Hopper kernel
// (bwd_kernel_sm90.h) where it is built. Causal calls over at most kBwdSm90MinCausalRows
// query rows keep the SM80 kernel, measured faster there (H200, bf16, hdim 128: 0.91x the SM80
// kernel at 512 tokens, 0.97x at 1k, 1.06x at 2k; hdim 64: 0.98x, 1.00x, 1.02x; likely, not
// profiled: a key block walks few row blocks, so the Hopper kernel's longer start and end weigh
// more). FLASH_ATTN_CUTE_SM90_BWD=0 / 1 (read at every call, so that one process can time both):
// never / wherever built.
constexpr int kBwdSm90MinCausalRows = 1024;
bool bwd_takes_sm90(BwdParams const& params) {
  if (!params.use_sm90 || params.deterministic) return false;
  const char* env = std::getenv("FLASH_ATTN_CUTE_SM90_BWD");
  if (env != nullptr && std::string(env) == "0") return false;
  if (env != nullptr && std::string(env) == "1") return true;
  return !(params.is_causal && params.seqlen_q <= kBwdSm90MinCausalRows);
}

}  // namespace

cudaError_t run_bwd_dispatch(BwdParams const& params, cudaStream_t stream) {
  if (bwd_takes_sm90(params)) {
#define FLASH_TRY_SM90(DT, HDIM, CAUSAL, EVEN_K, VARIANT)                  \
  if (matches(params, DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT)) \
    return run_bwd_sm90<DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT>(params, stream);
    FLASH_BWD_SM90_INSTANCES(FLASH_TRY_SM90)
#undef FLASH_TRY_SM90
  }
#define FLASH_TRY(DT, HDIM, CAUSAL, EVEN_K, VARIANT)                  \
  if (matches(params, DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT)) \
    return run_bwd<DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT>(params, stream);
  FLASH_BWD_INSTANCES(FLASH_TRY)
#undef FLASH_TRY
  return cudaErrorNotSupported;
}

#define FLASH_BUILT(DT, HDIM, CAUSAL, EVEN_K, VARIANT) \
  if (dtype == DType::DT && kernel_head_dim == HDIM && variant == Variant::VARIANT) return true;
bool fwd_is_built(DType dtype, int kernel_head_dim, Variant variant) {
  FLASH_FWD_INSTANCES(FLASH_BUILT)
  return false;
}
bool bwd_is_built(DType dtype, int kernel_head_dim, Variant variant) {
  FLASH_BWD_INSTANCES(FLASH_BUILT)
  return false;
}
#undef FLASH_BUILT

}  // namespace flash_attn_cute
