// Maps a runtime (dtype, head dim, causal, variant) to the instantiation this build compiled,
// for the forward and the backward. The lists come from csrc/features.py.
#include <cstdlib>
#include <string>

#include "flash_attn_cute/bwd_api.h"
#include "flash_attn_cute/fwd_api.h"
#include "generated/bwd_instances.h"
#include "generated/bwd_sm90_instances.h"
#include "generated/bwd_small_instances.h"
#include "generated/fwd_instances.h"
#include "generated/fwd_sm90_instances.h"
#include "generated/fwd_small_instances.h"

namespace flash_attn_cute {
namespace {

bool matches(FwdParams const& params, DType dtype, int hdim, bool causal, bool even_k, Variant variant) {
  const int kernel_head_dim = fwd_kernel_head_dim(params.head_dim);
  return params.dtype == dtype && kernel_head_dim == hdim && params.is_causal == causal &&
         (params.head_dim == kernel_head_dim) == even_k && params.variant() == variant;
}

}  // namespace

// In a dispatcher: returns RUN<...>(params, stream) for an X-macro entry that matches params.
#define FLASH_TRY_RUN(RUN, DT, HDIM, CAUSAL, EVEN_K, VARIANT)              \
  if (matches(params, DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT)) \
    return RUN<DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT>(params, stream);

cudaError_t run_fwd_dispatch(FwdParams const& params, cudaStream_t stream) {
  // A GPU that allows a block less shared memory than the SM80 kernel's tiles take (fwd_small_smem;
  // params.smem_optin 0: not known, the default tiles): its small tiles, where built.
  if (params.smem_optin > 0 && !params.uses_split_kernel() &&
      fwd_small_smem(fwd_kernel_head_dim(params.head_dim), params.is_causal, params.variant(), params.smem_optin)) {
    if (!small_smem_runs_on(params.cc_major)) return cudaErrorLaunchOutOfResources;
#define FLASH_TRY_SMALL(...) FLASH_TRY_RUN(run_fwd_small, __VA_ARGS__)
    FLASH_FWD_SMALL_INSTANCES(FLASH_TRY_SMALL)
#undef FLASH_TRY_SMALL
    return cudaErrorLaunchOutOfResources;  // built without them: no kernel of this build fits the GPU
  }
  if (params.use_sm90 && !params.uses_split_kernel()) {
#define FLASH_TRY_SM90(DT, HDIM, CAUSAL, EVEN_K, VARIANT)                                              \
  if (matches(params, DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT) &&                           \
      (!fwd_sm90_ws_only(HDIM, Variant::VARIANT) || fwd_sm90_takes_ws(params, HDIM, Variant::VARIANT))) \
    return run_fwd_sm90<DType::DT, HDIM, CAUSAL, EVEN_K, Variant::VARIANT>(params, stream);
    FLASH_FWD_SM90_INSTANCES(FLASH_TRY_SM90)
#undef FLASH_TRY_SM90
  }
#define FLASH_TRY(...) FLASH_TRY_RUN(run_fwd, __VA_ARGS__)
  FLASH_FWD_INSTANCES(FLASH_TRY)
#undef FLASH_TRY
  return cudaErrorNotSupported;
}

namespace {

// Whether a backward on compute capability 9.0 takes the Hopper kernel (bwd_kernel_sm90.h) where it
// is built: every non-deterministic call, and the deterministic ones of bwd_sm90_deterministic
// (since session 58). (Session 23 kept causal calls over at most 1024 query rows
// on the SM80 kernel; with session 24's stmatrix stores and 128-row steps at head dim 64 the Hopper
// kernel is the faster there too, H200 bf16 causal: hdim 64 127.5 / 191.0 TFLOP/s against 123.1 /
// 176.4 at 512 / 1024 tokens, hdim 128 151.2 / 218.7 against 148.3 / 209.4.)
// FLASH_ATTN_CUTE_SM90_BWD=0 / 1 (read at every call, so that one process can time both): never /
// wherever built.
bool bwd_takes_sm90(BwdParams const& params) {
  if (!params.use_sm90) return false;
  if (params.deterministic && !bwd_sm90_deterministic(fwd_kernel_head_dim(params.head_dim), params.variant())) {
    return false;
  }
  const char* env = std::getenv("FLASH_ATTN_CUTE_SM90_BWD");
  return env == nullptr || std::string(env) != "0";
}

}  // namespace

cudaError_t run_bwd_dispatch(BwdParams const& params, cudaStream_t stream) {
  if (params.small_smem) {
#define FLASH_TRY_SMALL(...) FLASH_TRY_RUN(run_bwd_small, __VA_ARGS__)
    FLASH_BWD_SMALL_INSTANCES(FLASH_TRY_SMALL)
#undef FLASH_TRY_SMALL
    return cudaErrorLaunchOutOfResources;  // built without them: no kernel of this build fits the GPU
  }
  if (bwd_takes_sm90(params)) {
#define FLASH_TRY_SM90(...) FLASH_TRY_RUN(run_bwd_sm90, __VA_ARGS__)
    FLASH_BWD_SM90_INSTANCES(FLASH_TRY_SM90)
#undef FLASH_TRY_SM90
  }
#define FLASH_TRY(...) FLASH_TRY_RUN(run_bwd, __VA_ARGS__)
  FLASH_BWD_INSTANCES(FLASH_TRY)
#undef FLASH_TRY
  return cudaErrorNotSupported;
}

#undef FLASH_TRY_RUN

bool small_smem_runs_on(int cc_major) { return cc_major < 9 || FLASH_SMALL_SMEM_EVERY_ARCH; }

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
