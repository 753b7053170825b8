// The torch-facing entry points that csrc/ops.cpp registers.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "glue.h"

namespace flash_attn_cute {

// Writes attention(q, k, v) into out and returns softmax_lse (fp32). With dropout_p > 0 the
// kernel writes the RNG's (seed, offset) into rng_state for the backward, and out's rounding
// residual into out_residual when given (FwdParams::o_residual).
at::Tensor fwd(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor& out,
               std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
               int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
               int64_t window_right, double softcap, std::optional<at::Tensor> const& alibi_slopes,
               std::optional<at::Tensor> const& seqused_k, double dropout_p, std::optional<at::Tensor> const& rng_state,
               std::optional<at::Tensor> const& block_table, std::optional<at::Tensor> const& out_residual,
               std::optional<at::Tensor> const& leftpad_k);

// Writes the gradients of attention(q, k, v) (which gave out and softmax_lse) for dout into dq, dk, dv.
void bwd(at::Tensor const& dout, at::Tensor const& q, at::Tensor const& k, at::Tensor const& v,
         at::Tensor const& out, at::Tensor const& softmax_lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
         std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
         int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
         int64_t window_right, double softcap, std::optional<at::Tensor> const& alibi_slopes, bool deterministic,
         std::optional<at::Tensor> const& seqused_k, double dropout_p, std::optional<at::Tensor> const& rng_state,
         std::optional<at::Tensor> const& out_residual);

// Where dropout (dropout_p, rng_state of the forward) keeps an entry: bool (batch, heads,
// max_seqlen_q, max_seqlen_k), false past each sequence's lengths (varlen: cu_seqlens).
at::Tensor dropout_mask(at::Tensor const& rng_state, double dropout_p, int64_t batch, int64_t heads,
                        int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<at::Tensor> const& cu_seqlens_q,
                        std::optional<at::Tensor> const& cu_seqlens_k);

// flash_attn_with_kvcache: appends k and v (when given; k rotated by rotary_cos / rotary_sin when
// given) to a KV cache (dense, batch-indexed or paged) at row cache_seqlens[b] (without
// cache_seqlens: cache_rows in every sequence), rotating q likewise, then attends q over each
// sequence's rows in use, the appended ones included. Returns (out, softmax_lse). One call from
// Python: an eager decoder pays its host time once per layer and token. num_splits 0 picks the
// split count.
std::tuple<at::Tensor, at::Tensor> fwd_kvcache(
    at::Tensor const& q, at::Tensor& k_cache, at::Tensor& v_cache, std::optional<at::Tensor> const& k,
    std::optional<at::Tensor> const& v, std::optional<at::Tensor> const& rotary_cos,
    std::optional<at::Tensor> const& rotary_sin, std::optional<at::Tensor> const& cache_seqlens, int64_t cache_rows,
    std::optional<at::Tensor> const& cache_batch_idx, std::optional<at::Tensor> const& leftpad_k,
    std::optional<at::Tensor> const& block_table, double softmax_scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap, bool rotary_interleaved, std::optional<at::Tensor> const& alibi_slopes,
    int64_t num_splits);

// flash_attn_func's attention for eager calls: the forward op on q, k, v (copied where the kernels
// cannot take their layout), through a C++ autograd function whose backward runs the backward op
// where grad mode is on and q, k or v requires grad. Returns [out, softmax_lse] and, with dropout,
// rng_state. Head dims that are multiples of 8 (the Python layer pads the others).
std::vector<at::Tensor> attention(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v,
                                  std::optional<at::Tensor> const& cu_seqlens_q,
                                  std::optional<at::Tensor> const& cu_seqlens_k, int64_t max_seqlen_q,
                                  int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
                                  int64_t window_right, double softcap, std::optional<at::Tensor> const& alibi_slopes,
                                  std::optional<at::Tensor> const& seqused_k, double dropout_p, bool deterministic);

}  // namespace flash_attn_cute
