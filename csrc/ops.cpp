// Op registration only: the schemas torch.compile and the Python layer see, and the Python module
// that carries them.
#include <torch/extension.h>
#include <torch/library.h>

#include "flash_attn_cute/fwd_api.h"
#include "generated/fwd_instances.h"
#include "torch_api.h"

TORCH_LIBRARY(flash_attn_cute, m) {
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
      "int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal) -> Tensor");
}

TORCH_LIBRARY_IMPL(flash_attn_cute, CUDA, m) { m.impl("fwd", &flash_attn_cute::fwd); }

namespace {

// The (dtype, kernel head dim, causal) forward kernels compiled into this build (each in its
// even-K and uneven-K variants).
pybind11::list built_fwd_kernels() {
  pybind11::list kernels;
#define FLASH_FWD_LIST(DT, HDIM, CAUSAL, EVEN_K)                                                    \
  if (EVEN_K)                                                                                      \
    kernels.append(pybind11::make_tuple(std::string(#DT) == "kFloat16" ? "fp16" : "bf16", HDIM, CAUSAL));
  FLASH_FWD_INSTANCES(FLASH_FWD_LIST)
#undef FLASH_FWD_LIST
  return kernels;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("built_fwd_kernels", &built_fwd_kernels, "(dtype, kernel head dim, causal) forward kernels in this build");
}
