// Torch glue for the backward: checks the tensors, allocates the fp32 scratch (D, the dQ
// accumulator and, when deterministic, its counters), fills BwdParams and dispatches.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "flash_attn_cute/bwd_api.h"
#include "flash_attn_cute/fwd_api.h"
#include "flash_attn_cute/varlen_rows.h"
#include "glue.h"
#include "torch_api.h"

namespace flash_attn_cute {

void bwd(at::Tensor const& dout, at::Tensor const& q, at::Tensor const& k, at::Tensor const& v,
         at::Tensor const& out, at::Tensor const& softmax_lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
         std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
         int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
         int64_t window_right, double softcap, std::optional<at::Tensor> const& alibi_slopes, bool deterministic,
         std::optional<at::Tensor> const& seqused_k, double dropout_p, std::optional<at::Tensor> const& rng_state,
         std::optional<at::Tensor> const& out_residual) {
  const ScoreMods mods{window_left, window_right, softcap, alibi_slopes, dropout_p};
  causal = kernel_causal(mods, causal);
  const Problem p = check_problem(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  const int kernel_head_dim = fwd_kernel_head_dim(int(p.head_dim));
  check_built(p, mods, causal, q, true);
  check_like(dout, q, "dout", "q");
  check_like(dq, q, "dq", "q");
  check_like(dk, k, "dk", "k");
  check_like(dv, v, "dv", "v");
  TORCH_CHECK(softmax_lse.scalar_type() == at::kFloat && softmax_lse.sizes() == at::IntArrayRef(lse_shape(p)) &&
                  softmax_lse.is_contiguous() && softmax_lse.device() == q.device(),
              "flash_attn_cute: softmax_lse must be the forward's contiguous float32 ",
              p.varlen ? "(nheads, total_q)" : "(batch, nheads, seqlen_q)", " tensor");

  c10::cuda::CUDAGuard device_guard(q.device());
  if (p.batch == 0 || p.heads == 0 || p.seqlen_q == 0 || p.seqlen_k == 0) {  // no (row, key) pair anywhere
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return;
  }
  BwdParams params;
  fill_params(params, p, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal);
  // GPUs that allow a block less shared memory than the default tiles take (sm_86 / sm_89, sm_80 at
  // head dim 256) run the SM80 backward on small tiles; at head dim 256 on sm_86 / sm_89, with V in
  // registers, but for dropout.
  const Variant variant = kernel_variant(p, mods, causal);
  const BwdTileShape tile = bwd_tile_for(kernel_head_dim, variant, params.smem_optin);
  params.small_smem = bwd_small_smem(kernel_head_dim, params.smem_optin);
  params.v_in_regs = tile.v_in_regs;
  TORCH_CHECK(bwd_smem_bytes(tile, kernel_head_dim) <= params.smem_optin, "flash_attn_cute: the backward kernel for head dim ",
              p.head_dim, variant == Variant::kDropout ? " with dropout" : "",
              " needs more shared memory per block than this GPU's ", params.smem_optin / 1024, " KB");
  TORCH_CHECK(!params.small_smem || small_smem_runs_on(params.cc_major), "flash_attn_cute: FLASH_ATTN_CUTE_SMEM_LIMIT picks "
              "the backward's small tiles, which this build has for GPUs below sm_90 only (FLASH_ATTN_CUTE_SMALL_SMEM=1 builds "
              "them for all)");
  const int block_m = tile.block_m;
  const int64_t m_blocks = (p.seqlen_q + block_m - 1) / block_m;
  const int64_t n_blocks = (p.seqlen_k + tile.block_n - 1) / tile.block_n;
  TORCH_CHECK(n_blocks <= 65535 || !deterministic,  // grid.z (see bwd_grid_key_block_major)
              "flash_attn_cute: the deterministic backward supports seqlen_k up to ",
              num(65535 * int64_t(tile.block_n)), " for this head dim");

  // The dQ accumulator (see BwdParams): whole row blocks per sequence, (head, row, dim) order, so
  // that a row block of one head is contiguous (bwd_epilogue.h).
  const int64_t accum_rows = p.varlen ? p.total_q + p.batch * block_m : m_blocks * block_m;
  auto f32 = q.options().dtype(at::kFloat);
  at::Tensor dsoftmax_sum = at::empty(lse_shape(p), f32);
  const int64_t accum_cols = dq_accum_row_floats(kernel_head_dim);
  at::Tensor dq_accum = p.varlen ? at::empty({p.heads, accum_rows, accum_cols}, f32)
                                 : at::empty({p.batch, p.heads, accum_rows, accum_cols}, f32);
  // Zeroed by a memset on the launch's stream: at::zeros' fill goes through a TensorIterator
  // launch, a few microseconds more host time per backward.
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  check_launch(cudaMemsetAsync(dq_accum.data_ptr(), 0, dq_accum.nbytes(), stream), "dQ accumulator memset");
  at::Tensor dq_semaphore;  // seeded by the preprocess kernel; one per row block of either backward
  if (deterministic) {
    const int64_t counters = (p.seqlen_q + kDqSemaphoreRowBlock - 1) / kDqSemaphoreRowBlock;
    dq_semaphore = at::empty({p.batch, p.heads, counters}, q.options().dtype(at::kInt));
  }

  set_score_mods(params, p, mods, causal, q);
  set_seqused_k(params, p, seqused_k, q);
  set_dropout(params, mods, rng_state, q, true);
  set_out_residual(params, out_residual, out, p.varlen);
  params.dout = view_of(dout, p.varlen);
  params.dq = view_of(dq, p.varlen);
  params.dk = view_of(dk, p.varlen);
  params.dv = view_of(dv, p.varlen);
  params.dsoftmax_sum_ptr = dsoftmax_sum.data_ptr<float>();
  params.dq_accum_ptr = dq_accum.data_ptr<float>();
  params.dq_accum_batch_stride = p.varlen ? 0 : dq_accum.stride(0);
  params.dq_accum_row_stride = dq_accum.stride(-2);
  params.dq_accum_head_stride = dq_accum.stride(-3);
  params.dq_accum_varlen_pad = p.varlen ? block_m : 0;
  params.deterministic = deterministic;
  params.dq_semaphore = deterministic ? dq_semaphore.data_ptr<int>() : nullptr;
  params.dq_rotate = bwd_dq_rotate(deterministic, params.window, n_blocks, params.num_sms);
  if (p.varlen) {
    // Varlen rows that no kernel writes (past cu_seqlens[-1], keys past seqused_k) get gradients
    // 0: without a host read of cu_seqlens, the kernel of varlen_rows.h finds them.
    UnwrittenRows unwritten{params};
    unwritten.query_rows[unwritten.n_query_rows++] = params.dq;
    unwritten.key_rows[unwritten.n_key_rows++] = params.dk;
    unwritten.key_rows[unwritten.n_key_rows++] = params.dv;
    check_launch(run_unwritten_rows(unwritten, stream), "unwritten rows kernel");
  }
  const cudaError_t err = run_bwd_dispatch(params, stream);
  check_launch(err, "backward kernel", params.device, p.head_dim);
}

}  // namespace flash_attn_cute
