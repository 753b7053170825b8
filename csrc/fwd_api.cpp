// Torch glue for the forward: checks the tensors, fills FwdParams and dispatches.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cmath>

#include "flash_attn_cute/fwd_api.h"
#include "flash_attn_cute/split_kv.h"
#include "glue.h"
#include "torch_api.h"

namespace flash_attn_cute {

at::Tensor fwd(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor& out,
               std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
               int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal) {
  const Problem p = check_problem(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  TORCH_CHECK(fwd_is_built(p.dtype, fwd_kernel_head_dim(p.head_dim)), "flash_attn_cute: no forward kernel for ",
              c10::toString(q.scalar_type()), " head dim ", num(p.head_dim),
              " in this build (see FLASH_ATTN_CUTE_HDIMS / _DTYPES)");

  c10::cuda::CUDAGuard device_guard(q.device());
  at::Tensor lse = at::empty(lse_shape(p), q.options().dtype(at::kFloat));
  // Varlen rows past cu_seqlens[-1] belong to no sequence and the kernel never visits them: they get
  // out = 0 and LSE = +inf, like rows that see no key. Without a host read of cu_seqlens, every row
  // is set first.
  if (p.varlen) {
    out.zero_();
    lse.fill_(INFINITY);
  }
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads == 0) return lse;

  FwdParams params;
  fill_params(params, p, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal);
  // Split-KV where the grid alone would leave SMs idle (few query row blocks, many key blocks).
  const int kernel_head_dim = fwd_kernel_head_dim(int(p.head_dim));
  const FwdTileShape tile = fwd_tile_shape(kernel_head_dim, causal);
  const int64_t ctas = p.batch * p.heads * ((p.seqlen_q + tile.block_m - 1) / tile.block_m);
  params.num_splits = num_splits_heuristic(int(std::min<int64_t>(ctas, 1 << 30)), params.num_sms,
                                           int((p.seqlen_k + tile.block_n - 1) / tile.block_n), kMaxSplits);
  at::Tensor oaccum, lseaccum;
  if (params.num_splits > 1) {
    params.split_stride = lse.numel();
    lseaccum = at::empty({params.num_splits, params.split_stride}, lse.options());
    oaccum = at::empty({params.num_splits, params.split_stride, kernel_head_dim}, lse.options());
    params.lseaccum_ptr = lseaccum.data_ptr<float>();
    params.oaccum_ptr = oaccum.data_ptr<float>();
  }
  const cudaError_t err = run_fwd_dispatch(params, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "flash_attn_cute: forward kernel launch failed: ", cudaGetErrorString(err));
  return lse;
}

}  // namespace flash_attn_cute
