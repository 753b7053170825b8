// flash_attn_func's forward and backward as one C++ autograd function, for eager calls: the engine
// runs the backward without a trip through Python. (The Python _FlashAttnFunc, which torch.compile
// traces and padded head dims take, cost a small training step 50-60 us more host time than
// torch's SDPA: session 67.) The ops are called through the dispatcher, so that profilers and
// dispatch modes see flash_attn_cute::fwd / bwd as they do from Python.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>

#include "torch_api.h"

// The ops' namespace; the CPU tests build this file against stand-in ops of their own.
#ifndef FLASH_ATTN_CUTE_OPS
#define FLASH_ATTN_CUTE_OPS "flash_attn_cute"
#endif

namespace flash_attn_cute {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// t itself if the kernels take its layout (kernel_layout_problem), else a contiguous copy in fresh
// memory: the Python layer's kernel_input.
at::Tensor kernel_input(at::Tensor const& t) {
  return kernel_layout_problem(t) == nullptr ? t : t.clone(at::MemoryFormat::Contiguous);
}

std::optional<at::Tensor> defined_or_none(at::Tensor const& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

at::Tensor tensor_or_undefined(std::optional<at::Tensor> const& t) { return t.value_or(at::Tensor()); }

// What a call gives besides q, k and v.
struct AttentionCall {
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_k, alibi_slopes, seqused_k;
  int64_t max_seqlen_q, max_seqlen_k;
  double softmax_scale;
  bool causal;
  int64_t window_left, window_right;
  double softcap, dropout_p;
  bool deterministic;
};

// The forward op's tensors: q, k, v as the kernels read them, its outputs and dropout's state.
struct Forward {
  at::Tensor q, k, v, out, lse;
  std::optional<at::Tensor> rng_state, out_residual;
};

// The forward op on q, k, v in layouts the kernels take. keep_residual: with dropout, out's rounding
// residual for the backward's exact row sums (FwdParams::o_residual).
Forward run_forward(at::Tensor const& q_in, at::Tensor const& k_in, at::Tensor const& v_in, AttentionCall const& c,
                    bool keep_residual) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow(FLASH_ATTN_CUTE_OPS "::fwd", "").typed<decltype(fwd)>();
  Forward f{kernel_input(q_in), kernel_input(k_in), kernel_input(v_in)};
  f.out = at::empty_like(f.q);
  if (c.dropout_p > 0.0) {
    f.rng_state = at::empty({2}, f.q.options().dtype(at::kLong));
    if (keep_residual) f.out_residual = at::empty_like(f.q);
  }
  f.lse = op.call(f.q, f.k, f.v, f.out, c.cu_seqlens_q, c.cu_seqlens_k, c.max_seqlen_q, c.max_seqlen_k, c.softmax_scale,
                  c.causal, c.window_left, c.window_right, c.softcap, c.alibi_slopes, c.seqused_k, c.dropout_p,
                  f.rng_state, std::nullopt, f.out_residual, std::nullopt);
  return f;
}

// Saved for the backward: the forward's tensors (Saved order), and the call's other arguments.
enum Saved { kQ, kK, kV, kOut, kLse, kRngState, kOutResidual, kCuSeqlensQ, kCuSeqlensK, kAlibiSlopes, kSequsedK };

// Makes out the output of an autograd node over q, k, v; the forward ran before (attention), so that
// the LSE and rng_state, which have no gradient, are no outputs of the node (marked non-differentiable,
// they would stay in its context, which compiled autograd refuses).
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::Tensor const& /* q */, at::Tensor const& /* k */,
                               at::Tensor const& /* v */, Forward const& f, AttentionCall const& c) {
    ctx->save_for_backward({f.q, f.k, f.v, f.out, f.lse, tensor_or_undefined(f.rng_state),
                            tensor_or_undefined(f.out_residual), tensor_or_undefined(c.cu_seqlens_q),
                            tensor_or_undefined(c.cu_seqlens_k), tensor_or_undefined(c.alibi_slopes),
                            tensor_or_undefined(c.seqused_k)});
    ctx->saved_data["max_seqlen_q"] = c.max_seqlen_q;
    ctx->saved_data["max_seqlen_k"] = c.max_seqlen_k;
    ctx->saved_data["softmax_scale"] = c.softmax_scale;
    ctx->saved_data["causal"] = c.causal;
    ctx->saved_data["window_left"] = c.window_left;
    ctx->saved_data["window_right"] = c.window_right;
    ctx->saved_data["softcap"] = c.softcap;
    ctx->saved_data["dropout_p"] = c.dropout_p;
    ctx->saved_data["deterministic"] = c.deterministic;
    return {f.out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow(FLASH_ATTN_CUTE_OPS "::bwd", "").typed<decltype(bwd)>();
    const variable_list s = ctx->get_saved_variables();
    auto const& d = ctx->saved_data;
    at::Tensor dout = kernel_input(grads[0]);
    at::Tensor dq = at::empty_like(s[kQ]), dk = at::empty_like(s[kK]), dv = at::empty_like(s[kV]);
    op.call(dout, s[kQ], s[kK], s[kV], s[kOut], s[kLse], dq, dk, dv, defined_or_none(s[kCuSeqlensQ]),
            defined_or_none(s[kCuSeqlensK]), d.at("max_seqlen_q").toInt(), d.at("max_seqlen_k").toInt(),
            d.at("softmax_scale").toDouble(), d.at("causal").toBool(), d.at("window_left").toInt(),
            d.at("window_right").toInt(), d.at("softcap").toDouble(), defined_or_none(s[kAlibiSlopes]),
            d.at("deterministic").toBool(), defined_or_none(s[kSequsedK]), d.at("dropout_p").toDouble(),
            defined_or_none(s[kRngState]), defined_or_none(s[kOutResidual]));
    return {dq, dk, dv, at::Tensor(), at::Tensor()};  // nothing for the Forward and the AttentionCall
  }
};

}  // namespace

std::vector<at::Tensor> attention(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v,
                                  std::optional<at::Tensor> const& cu_seqlens_q,
                                  std::optional<at::Tensor> const& cu_seqlens_k, int64_t max_seqlen_q,
                                  int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
                                  int64_t window_right, double softcap, std::optional<at::Tensor> const& alibi_slopes,
                                  std::optional<at::Tensor> const& seqused_k, double dropout_p, bool deterministic) {
  const AttentionCall c{cu_seqlens_q, cu_seqlens_k, alibi_slopes, seqused_k, max_seqlen_q,
                        max_seqlen_k, softmax_scale, causal,       window_left, window_right,
                        softcap,      dropout_p,    deterministic};
  const bool grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  Forward f;
  {
    const at::AutoGradMode no_grad(false);
    f = run_forward(q, k, v, c, grad);
  }
  if (grad) f.out = AttentionFunction::apply(q, k, v, f, c)[0];
  return f.rng_state ? std::vector<at::Tensor>{f.out, f.lse, *f.rng_state} : std::vector<at::Tensor>{f.out, f.lse};
}

}  // namespace flash_attn_cute
