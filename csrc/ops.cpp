// Op registration only: the schemas torch.compile and the Python layer see, and the Python module
// that carries them (with the eager autograd entry, csrc/autograd.cpp).
#include <torch/extension.h>
#include <torch/library.h>

#include "flash_attn_cute/bwd_api.h"
#include "flash_attn_cute/fwd_api.h"
#include "generated/bwd_instances.h"
#include "generated/bwd_sm90_instances.h"
#include "generated/bwd_small_instances.h"
#include "generated/fwd_small_instances.h"
#include "generated/fwd_instances.h"
#include "generated/fwd_sm90_instances.h"
#include "torch_api.h"

TORCH_LIBRARY(flash_attn_cute, m) {
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
      "int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, int window_size_left, "
      "int window_size_right, float softcap, Tensor? alibi_slopes, Tensor? seqused_k, float dropout_p, "
      "Tensor(b!)? rng_state, Tensor? block_table, Tensor(c!)? out_residual, Tensor? leftpad_k=None) -> Tensor");
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor(a!) dq, "
      "Tensor(b!) dk, Tensor(c!) dv, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, float softmax_scale, bool causal, int window_size_left, int window_size_right, "
      "float softcap, Tensor? alibi_slopes, bool deterministic, Tensor? seqused_k, float dropout_p, "
      "Tensor? rng_state, Tensor? out_residual) -> ()");
  m.def(
      "dropout_mask(Tensor rng_state, float dropout_p, int batch, int heads, int max_seqlen_q, int max_seqlen_k, "
      "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k) -> Tensor");
  m.def(
      "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor? rotary_cos, "
      "Tensor? rotary_sin, Tensor? cache_seqlens, int cache_rows, Tensor? cache_batch_idx, Tensor? leftpad_k, "
      "Tensor? block_table, float softmax_scale, bool causal, int window_size_left, int window_size_right, "
      "float softcap, bool rotary_interleaved, Tensor? alibi_slopes, int num_splits) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(flash_attn_cute, CUDA, m) {
  m.impl("fwd", &flash_attn_cute::fwd);
  m.impl("bwd", &flash_attn_cute::bwd);
  m.impl("fwd_kvcache", &flash_attn_cute::fwd_kvcache);
  m.impl("dropout_mask", &flash_attn_cute::dropout_mask);
}

namespace {

char const* variant_name(flash_attn_cute::Variant v) {
  using flash_attn_cute::Variant;
  return v == Variant::kPlain ? "plain" : v == Variant::kScoreMods ? "mods" : "dropout";
}

// The (dtype, kernel head dim, causal, variant) kernels of one X-macro list (csrc/generated/) compiled
// into this build, each once (a list holds the even-K and uneven-K forms); variant: "plain", "mods"
// (softcap / ALiBi / windows), "dropout".
#define FLASH_KERNEL_LIST(DT, HDIM, CAUSAL, EVEN_K, VARIANT)                                              \
  if (EVEN_K)                                                                                             \
    kernels.append(pybind11::make_tuple(std::string(#DT) == "kFloat16" ? "fp16" : "bf16", HDIM, CAUSAL, \
                                        variant_name(flash_attn_cute::Variant::VARIANT)));
#define FLASH_DEFINE_BUILT(NAME, INSTANCES) \
  pybind11::list NAME() {                   \
    pybind11::list kernels;                 \
    INSTANCES(FLASH_KERNEL_LIST)            \
    return kernels;                         \
  }
FLASH_DEFINE_BUILT(built_fwd_kernels, FLASH_FWD_INSTANCES)
FLASH_DEFINE_BUILT(built_bwd_kernels, FLASH_BWD_INSTANCES)
FLASH_DEFINE_BUILT(built_fwd_sm90_kernels, FLASH_FWD_SM90_INSTANCES)  // the Hopper forward (sm_90a)
FLASH_DEFINE_BUILT(built_bwd_sm90_kernels, FLASH_BWD_SM90_INSTANCES)  // the Hopper backward
// The small-tile forward and backward (GPUs with less shared memory a block than the default tiles take).
FLASH_DEFINE_BUILT(built_fwd_small_kernels, FLASH_FWD_SMALL_INSTANCES)
FLASH_DEFINE_BUILT(built_bwd_small_kernels, FLASH_BWD_SMALL_INSTANCES)
#undef FLASH_DEFINE_BUILT
#undef FLASH_KERNEL_LIST

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention", &flash_attn_cute::attention,
        "flash_attn_func's eager attention: [out, softmax_lse(, rng_state)] through a C++ autograd function");
  m.def("built_fwd_kernels", &built_fwd_kernels,
        "(dtype, kernel head dim, causal, variant) forward kernels in this build");
  m.def("built_bwd_kernels", &built_bwd_kernels,
        "(dtype, kernel head dim, causal, variant) backward kernels in this build");
  m.def("built_fwd_sm90_kernels", &built_fwd_sm90_kernels,
        "(dtype, kernel head dim, causal, variant) Hopper forward kernels in this build");
  m.def("built_bwd_sm90_kernels", &built_bwd_sm90_kernels,
        "(dtype, kernel head dim, causal, variant) Hopper backward kernels in this build");
  m.def("built_fwd_small_kernels", &built_fwd_small_kernels,
        "(dtype, kernel head dim, causal, variant) small-tile forward kernels in this build");
  m.def("built_bwd_small_kernels", &built_bwd_small_kernels,
        "(dtype, kernel head dim, causal, variant) small-tile backward kernels in this build");
  m.def("small_smem_runs_on_hopper", [] { return bool(FLASH_SMALL_SMEM_EVERY_ARCH); },
        "whether the small-tile kernels were built for sm_90 too (FLASH_ATTN_CUTE_SMALL_SMEM=1)");
}
