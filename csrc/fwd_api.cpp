// Torch glue for the forward: checks the tensors, fills FwdParams and dispatches.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>

#include "flash_attn_cute/dropout.h"
#include "flash_attn_cute/fwd_api.h"
#include "flash_attn_cute/varlen_rows.h"
#include "glue.h"
#include "torch_api.h"

namespace flash_attn_cute {

at::Tensor fwd(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor& out,
               std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
               int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
               int64_t window_right, double softcap, std::optional<at::Tensor> const& alibi_slopes,
               std::optional<at::Tensor> const& seqused_k, double dropout_p, std::optional<at::Tensor> const& rng_state,
               std::optional<at::Tensor> const& block_table, std::optional<at::Tensor> const& out_residual,
               std::optional<at::Tensor> const& leftpad_k) {
  const ScoreMods mods{window_left, window_right, softcap, alibi_slopes, dropout_p};
  causal = kernel_causal(mods, causal);
  // A paged K / V (varlen only): (pages, page_size, heads_k, dim) read through block_table (batch,
  // pages per sequence); cu_seqlens_k then only gives the lengths. The problem checks see one page.
  const bool paged = block_table.has_value();
  TORCH_CHECK(!paged || (cu_seqlens_k.has_value() && k.dim() == 4 && k.sizes() == v.sizes() && k.size(0) > 0),
              "flash_attn_cute: block_table needs the varlen form and k, v of shape (pages, page_size, nheads_k, "
              "headdim)");
  Problem p = check_problem(q, paged ? k[0] : k, paged ? v[0] : v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k);
  TORCH_CHECK(!paged || dropout_p == 0.0, "flash_attn_cute: a paged K / V (block_table) takes no dropout");
  TORCH_CHECK(!paged || p.seqlen_k <= check_block_table(*block_table, q, p.batch, k.size(1)),
              "flash_attn_cute: max_seqlen_k is more keys than a block_table row's pages hold");
  check_built(p, mods, causal, q);

  c10::cuda::CUDAGuard device_guard(q.device());
  FwdRows rows = forward_rows(p, q, out, mods);
  at::Tensor& lse = rows.lse;
  FwdParams params;
  fill_params(params, p, rows.q, k, v, rows.out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale,
              causal && !rows.packed);
  set_score_mods(params, rows.unpacked, mods, causal && !rows.packed, q);
  set_seqused_k(params, p, seqused_k, q);
  set_dropout(params, mods, rng_state, q, false);
  if (paged) set_paged_kv(params, *block_table, k, v);
  set_leftpad_k(params, p, leftpad_k, q);
  TORCH_CHECK(!out_residual || dropout_p > 0.0, "flash_attn_cute: out_residual is written by the dropout forward only");
  set_out_residual(params, out_residual, out, p.varlen);
  // Every argument is checked: from here on the call writes.
  // Varlen rows that no kernel writes (past cu_seqlens[-1], say) get out = 0 and LSE = +inf, like
  // rows that see no key: without a host read of cu_seqlens, the kernel of varlen_rows.h finds them.
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads == 0) {
    if (p.varlen) {
      out.zero_();
      lse.fill_(INFINITY);
    }
    return rows.caller_lse();
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  if (p.varlen) {
    UnwrittenRows unwritten{params};
    unwritten.query_rows[unwritten.n_query_rows++] = params.o;
    unwritten.lse = true;
    check_launch(run_unwritten_rows(unwritten, stream), "unwritten rows kernel");
  }
  // Split-KV where the grid alone would leave SMs idle (few query row blocks, many key blocks).
  const std::vector<at::Tensor> split_buffers = choose_splits(params, p, lse, 0);
  const std::vector<at::Tensor> scratch = ws_scratch(params, p, q);
  draw_dropout_seed(params);
  const cudaError_t err = run_fwd_dispatch(params, stream);
  check_launch(err, "forward kernel", params.device, p.head_dim);
  return rows.caller_lse();
}

at::Tensor dropout_mask(at::Tensor const& rng_state, double dropout_p, int64_t batch, int64_t heads,
                        int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<at::Tensor> const& cu_seqlens_q,
                        std::optional<at::Tensor> const& cu_seqlens_k) {
  check_rng_state(rng_state, rng_state.device());
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "flash_attn_cute: dropout_p must be in [0, 1)");
  TORCH_CHECK(batch >= 0 && heads >= 0 && max_seqlen_q >= 0 && max_seqlen_k >= 0 && batch <= 65535 && heads <= 65535 &&
                  max_seqlen_q <= kMaxSeqlen && max_seqlen_k <= kMaxSeqlen,
              "flash_attn_cute: dropout_mask sizes out of range");
  TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
              "flash_attn_cute: give both cu_seqlens_q and cu_seqlens_k or neither");
  for (auto const* cu : {&cu_seqlens_q, &cu_seqlens_k}) {
    TORCH_CHECK(!cu->has_value() || ((*cu)->scalar_type() == at::kInt && (*cu)->dim() == 1 &&
                                     (*cu)->size(0) == batch + 1 && (*cu)->is_contiguous() &&
                                     (*cu)->device() == rng_state.device()),
                "flash_attn_cute: cu_seqlens must be contiguous int32 (batch + 1,) on rng_state's device");
  }
  c10::cuda::CUDAGuard device_guard(rng_state.device());
  at::Tensor mask = at::empty({batch, heads, max_seqlen_q, max_seqlen_k}, rng_state.options().dtype(at::kBool));
  DropoutMaskParams params;
  params.dropout.p = float(dropout_p);
  params.dropout.seed_ptr = rng_state.data_ptr<int64_t>();
  params.dropout.offset_ptr = params.dropout.seed_ptr + 1;
  params.out = mask.data_ptr<bool>();
  params.batch = int(batch);
  params.heads = int(heads);
  params.seqlen_q = int(max_seqlen_q);
  params.seqlen_k = int(max_seqlen_k);
  params.cu_seqlens_q = cu_seqlens_q ? cu_seqlens_q->data_ptr<int>() : nullptr;
  params.cu_seqlens_k = cu_seqlens_k ? cu_seqlens_k->data_ptr<int>() : nullptr;
  const cudaError_t err = run_dropout_mask(params, c10::cuda::getCurrentCUDAStream().stream());
  check_launch(err, "dropout_mask");
  return mask;
}

}  // namespace flash_attn_cute
