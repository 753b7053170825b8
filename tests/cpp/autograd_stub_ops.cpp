// CPU stand-ins for the fwd / bwd ops, with which csrc/autograd.cpp (the C++ autograd function of
// eager flash_attn_func calls) builds and runs against a CPU torch: tests/test_autograd.py checks
// what it saves, passes and returns with no GPU. Dense (batch, seqlen, heads, dim) tensors, one KV
// head per query head, causal (bottom-right) or not. Dropout: the forward draws a seed, writes it
// into rng_state and drops entries by a CPU generator seeded from it; the backward redraws from the
// rng_state it receives, so a backward that got another forward's state gives wrong gradients.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/extension.h>

#include "torch_api.h"

namespace flash_attn_cute {
namespace {

struct Probs {
  at::Tensor p, keep;  // softmax (batch, heads, seqlen_q, seqlen_k), float64; the kept entries
};

Probs probs(at::Tensor const& q, at::Tensor const& k, double softmax_scale, bool causal, double dropout_p,
            int64_t seed) {
  at::Tensor s = at::einsum("bqhd,bkhd->bhqk", {q.to(at::kDouble), k.to(at::kDouble)}) * softmax_scale;
  if (causal) {
    const int64_t seqlen_q = q.size(1), seqlen_k = k.size(1);
    at::Tensor row = at::arange(seqlen_q).unsqueeze(1), col = at::arange(seqlen_k).unsqueeze(0);
    s = s.masked_fill(col > row + (seqlen_k - seqlen_q), -INFINITY);
  }
  Probs r{at::softmax(s, -1), at::ones_like(s, s.options().dtype(at::kBool))};
  if (dropout_p > 0.0) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(seed));
    r.keep = at::empty_like(s).uniform_(0.0, 1.0, gen) >= dropout_p;
  }
  return r;
}

at::Tensor dropped(Probs const& pr, double dropout_p) {
  return dropout_p > 0.0 ? pr.p * pr.keep / (1.0 - dropout_p) : pr.p;
}

int64_t next_seed = 1;

// The layout the kernels read (glue.cpp's view_of): what the autograd function must hand the ops.
bool kernels_read(at::Tensor const& t) {
  bool ok = t.stride(-1) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int i = 0; i + 1 < t.dim(); ++i) ok = ok && (t.stride(i) % 8 == 0 || t.size(i) == 1);
  return ok;
}

}  // namespace

at::Tensor fwd(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor& out,
               std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, int64_t, int64_t,
               double softmax_scale, bool causal, int64_t, int64_t, double, std::optional<at::Tensor> const&,
               std::optional<at::Tensor> const&, double dropout_p, std::optional<at::Tensor> const& rng_state,
               std::optional<at::Tensor> const&, std::optional<at::Tensor> const& out_residual,
               std::optional<at::Tensor> const&) {
  TORCH_CHECK(kernels_read(q) && kernels_read(k) && kernels_read(v), "stub fwd: a layout the kernels cannot read");
  TORCH_CHECK(rng_state.has_value() == (dropout_p > 0.0), "stub fwd: rng_state exactly with dropout");
  const int64_t seed = dropout_p > 0.0 ? next_seed++ : 0;
  if (rng_state) rng_state->copy_(at::tensor({seed, int64_t(0)}));
  if (out_residual) out_residual->zero_();
  const Probs pr = probs(q, k, softmax_scale, causal, dropout_p, seed);
  out.copy_(at::einsum("bhqk,bkhd->bqhd", {dropped(pr, dropout_p), v.to(at::kDouble)}));
  return at::ones({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
}

void bwd(at::Tensor const& dout, at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor const& out,
         at::Tensor const& softmax_lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
         std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, int64_t, int64_t, double softmax_scale,
         bool causal, int64_t, int64_t, double, std::optional<at::Tensor> const&, bool,
         std::optional<at::Tensor> const&, double dropout_p, std::optional<at::Tensor> const& rng_state,
         std::optional<at::Tensor> const& out_residual) {
  TORCH_CHECK(kernels_read(dout) && kernels_read(q) && softmax_lse.size(1) == q.size(2),
              "stub bwd: a layout the kernels cannot read, or not the forward's LSE");
  TORCH_CHECK(rng_state.has_value() == (dropout_p > 0.0) && out_residual.has_value() == (dropout_p > 0.0),
              "stub bwd: rng_state and out_residual exactly with dropout");
  const Probs pr = probs(q, k, softmax_scale, causal, dropout_p, rng_state ? (*rng_state)[0].item<int64_t>() : 0);
  const at::Tensor d_o = dout.to(at::kDouble), pd = dropped(pr, dropout_p);
  dv.copy_(at::einsum("bhqk,bqhd->bkhd", {pd, d_o}));
  at::Tensor dp = at::einsum("bqhd,bkhd->bhqk", {d_o, v.to(at::kDouble)});
  if (dropout_p > 0.0) dp = dp * pr.keep / (1.0 - dropout_p);
  const at::Tensor ds = pr.p * (dp - (dp * pr.p).sum(-1, true)) * softmax_scale;
  dq.copy_(at::einsum("bhqk,bkhd->bqhd", {ds, k.to(at::kDouble)}));
  dk.copy_(at::einsum("bhqk,bqhd->bkhd", {ds, q.to(at::kDouble)}));
  (void)out;
}

}  // namespace flash_attn_cute

// Their own namespace (autograd.cpp built with FLASH_ATTN_CUTE_OPS="flash_attn_cute_stub"): the
// real ops, where loaded, and the Python layer's CPU tests never meet these.
TORCH_LIBRARY(flash_attn_cute_stub, m) {
  m.def("fwd", &flash_attn_cute::fwd);
  m.def("bwd", &flash_attn_cute::bwd);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("attention", &flash_attn_cute::attention); }
