// The torch-facing entry points that csrc/ops.cpp registers.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace flash_attn_cute {

// Writes attention(q, k, v) into out and returns softmax_lse (fp32).
at::Tensor fwd(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor& out,
               std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
               int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal);

// Writes the gradients of attention(q, k, v) (which gave out and softmax_lse) for dout into dq, dk, dv.
void bwd(at::Tensor const& dout, at::Tensor const& q, at::Tensor const& k, at::Tensor const& v,
         at::Tensor const& out, at::Tensor const& softmax_lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
         std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
         int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, bool deterministic);

}  // namespace flash_attn_cute
