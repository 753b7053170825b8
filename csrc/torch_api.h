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

// A decode step's append, one kernel launch: k and v (batch, rows, heads_k, dim) into the caches at
// row cache_seqlens[b] of a dense, batch-indexed or paged cache, k rotated by cos / sin when given;
// q (with cos / sin) rotated into q_rotated at positions cache_seqlens[b] (+ its row when
// q_per_row); seqused_k[b] = cache_seqlens[b] + rows, the attention's cache lengths.
void append_kv(at::Tensor const& k, at::Tensor const& v, at::Tensor& k_cache, at::Tensor& v_cache,
               at::Tensor const& cache_seqlens, std::optional<at::Tensor> const& cache_batch_idx,
               std::optional<at::Tensor> const& block_table, std::optional<at::Tensor> const& cos,
               std::optional<at::Tensor> const& sin, bool interleaved, std::optional<at::Tensor> const& q,
               std::optional<at::Tensor> const& q_rotated, bool q_per_row, at::Tensor& seqused_k);

// Where dropout (dropout_p, rng_state of the forward) keeps an entry: bool (batch, heads,
// max_seqlen_q, max_seqlen_k), false past each sequence's lengths (varlen: cu_seqlens).
at::Tensor dropout_mask(at::Tensor const& rng_state, double dropout_p, int64_t batch, int64_t heads,
                        int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<at::Tensor> const& cu_seqlens_q,
                        std::optional<at::Tensor> const& cu_seqlens_k);

// Attention of q over the first seqused_k[b] keys of a KV cache (dense, batch-indexed or paged);
// writes out and returns softmax_lse. num_splits 0 picks the split count.
at::Tensor fwd_kvcache(at::Tensor const& q, at::Tensor const& k_cache, at::Tensor const& v_cache, at::Tensor& out,
                       at::Tensor const& seqused_k, std::optional<at::Tensor> const& leftpad_k,
                       std::optional<at::Tensor> const& kv_batch_idx, std::optional<at::Tensor> const& block_table,
                       double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
                       std::optional<at::Tensor> const& alibi_slopes, int64_t num_splits);

}  // namespace flash_attn_cute
