// Torch glue for the forward: checks the tensors, fills FwdParams and dispatches.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>

#include "flash_attn_cute/fwd_api.h"
#include "glue.h"
#include "torch_api.h"

namespace flash_attn_cute {

at::Tensor fwd(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor& out,
               std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
               int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
               int64_t window_right, double softcap, std::optional<at::Tensor> const& alibi_slopes,
               std::optional<at::Tensor> const& seqused_k) {
  const ScoreMods mods{window_left, window_right, softcap, alibi_slopes};
  Problem p = check_problem(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  check_fwd_built(p, mods, causal, q);

  c10::cuda::CUDAGuard device_guard(q.device());
  FwdRows rows = forward_rows(p, q, out, mods);
  at::Tensor& lse = rows.lse;
  // Varlen rows past cu_seqlens[-1] belong to no sequence and the kernel never visits them: they get
  // out = 0 and LSE = +inf, like rows that see no key. Without a host read of cu_seqlens, every row
  // is set first.
  if (p.varlen) {
    out.zero_();
    lse.fill_(INFINITY);
  }
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads == 0) return lse.view(rows.lse_sizes);

  FwdParams params;
  fill_params(params, p, rows.q, k, v, rows.out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale,
              causal && !rows.packed);
  set_score_mods(params, rows.unpacked, mods, causal && !rows.packed, q);
  set_seqused_k(params, p, seqused_k, q);
  // Split-KV where the grid alone would leave SMs idle (few query row blocks, many key blocks).
  const std::vector<at::Tensor> split_buffers = choose_splits(params, p, lse, 0);
  const cudaError_t err = run_fwd_dispatch(params, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "flash_attn_cute: forward kernel launch failed: ", cudaGetErrorString(err));
  return lse.view(rows.lse_sizes);
}

}  // namespace flash_attn_cute
