// Torch glue for the forward: checks the tensors (the Python layer checks first, with friendlier
// messages; these checks keep a direct torch.ops call from reaching the kernel with bad input),
// fills FwdParams and dispatches.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <optional>
#include <string>

#include "flash_attn_cute/fwd_api.h"
#include "torch_api.h"

namespace flash_attn_cute {
namespace {

// Numbers go into messages through std::to_string, never through an ostream: built with a newer
// GCC than the libstdc++ torch loads (the GPU image's /opt/gcc), inlined ostream number formatting
// crashes inside the extension (seen on the H200 machine, 2026-11-29).
std::string num(int64_t x) { return std::to_string(x); }

DType dtype_of(at::Tensor const& t) {
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
              "flash_attn_cute: q, k, v must be float16 or bfloat16, got ", c10::toString(t.scalar_type()));
  return t.scalar_type() == at::kHalf ? DType::kFloat16 : DType::kBFloat16;
}

// (batch, seqlen, heads, dim), or (total, heads, dim) in varlen mode.
TensorView view_of(at::Tensor const& t, bool varlen) {
  TORCH_CHECK(t.stride(-1) == 1, "flash_attn_cute: tensors must have a contiguous last dimension");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
              "flash_attn_cute: tensor data must be 16-byte aligned");
  for (int i = 0; i + 1 < t.dim(); ++i) {
    TORCH_CHECK(t.stride(i) % 8 == 0 || t.size(i) == 1,
                "flash_attn_cute: strides must be multiples of 8 elements (16 bytes)");
  }
  TensorView view;
  view.ptr = t.data_ptr();
  const int o = varlen ? 1 : 0;
  view.batch_stride = varlen ? 0 : t.stride(0);
  view.row_stride = t.stride(1 - o);
  view.head_stride = t.stride(2 - o);
  return view;
}

void check_cu_seqlens(std::optional<at::Tensor> const& cu, int64_t batch, at::Tensor const& q, char const* name) {
  TORCH_CHECK(cu->scalar_type() == at::kInt, "flash_attn_cute: ", name, " must be int32");
  TORCH_CHECK(cu->dim() == 1 && cu->size(0) == batch + 1, "flash_attn_cute: ", name, " must have shape (batch + 1,)");
  TORCH_CHECK(cu->is_contiguous() && cu->device() == q.device(), "flash_attn_cute: ", name,
              " must be contiguous and on q's device");
}

}  // namespace

at::Tensor fwd(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor& out,
               std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
               int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal) {
  const bool varlen = cu_seqlens_q.has_value();
  TORCH_CHECK(varlen == cu_seqlens_k.has_value(), "flash_attn_cute: give both cu_seqlens_q and cu_seqlens_k or neither");
  const int rank = varlen ? 3 : 4;
  TORCH_CHECK(q.dim() == rank && k.dim() == rank && v.dim() == rank && out.dim() == rank,
              "flash_attn_cute: q, k, v, out must be ", num(rank), "-D");
  const DType dtype = dtype_of(q);
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                  out.scalar_type() == q.scalar_type(),
              "flash_attn_cute: q, k, v, out must share one dtype");
  TORCH_CHECK(q.is_cuda() && k.device() == q.device() && v.device() == q.device() && out.device() == q.device(),
              "flash_attn_cute: q, k, v, out must be on the same CUDA device");
  TORCH_CHECK(k.sizes() == v.sizes(), "flash_attn_cute: k and v must have the same shape");
  TORCH_CHECK(out.sizes() == q.sizes(), "flash_attn_cute: out must have q's shape");

  const int64_t batch = varlen ? cu_seqlens_q->size(0) - 1 : q.size(0);
  const int64_t heads = q.size(-2), heads_k = k.size(-2), head_dim = q.size(-1);
  TORCH_CHECK(k.size(-1) == head_dim, "flash_attn_cute: q and k must have the same head dim");
  TORCH_CHECK(head_dim % 8 == 0 && head_dim > 0 && head_dim <= kMaxHeadDim,
              "flash_attn_cute: head dim must be a multiple of 8 in [8, ", num(kMaxHeadDim), "], got ", num(head_dim));
  TORCH_CHECK(heads_k > 0 && heads % heads_k == 0, "flash_attn_cute: nheads must be a multiple of nheads_k");
  TORCH_CHECK(fwd_is_built(dtype, fwd_kernel_head_dim(head_dim)), "flash_attn_cute: no kernel for ",
              c10::toString(q.scalar_type()), " head dim ", num(head_dim),
              " in this build (see FLASH_ATTN_CUTE_HDIMS / _DTYPES)");
  if (varlen) {
    check_cu_seqlens(cu_seqlens_q, batch, q, "cu_seqlens_q");
    check_cu_seqlens(cu_seqlens_k, batch, q, "cu_seqlens_k");
  } else {
    TORCH_CHECK(k.size(0) == batch, "flash_attn_cute: q and k must have the same batch size");
    max_seqlen_q = q.size(1);
    max_seqlen_k = k.size(1);
  }
  TORCH_CHECK(batch <= 65535 && heads <= 65535, "flash_attn_cute: batch and nheads must be at most 65535");

  c10::cuda::CUDAGuard device_guard(q.device());
  const int64_t total_q = q.size(0);
  at::Tensor lse = varlen ? at::empty({heads, total_q}, q.options().dtype(at::kFloat))
                          : at::empty({batch, heads, max_seqlen_q}, q.options().dtype(at::kFloat));
  if (batch == 0 || max_seqlen_q == 0 || heads == 0) return lse;

  FwdParams params;
  params.q = view_of(q, varlen);
  params.k = view_of(k, varlen);
  params.v = view_of(v, varlen);
  params.o = view_of(out, varlen);
  params.softmax_lse_ptr = lse.data_ptr<float>();
  params.lse_batch_stride = varlen ? 0 : heads * max_seqlen_q;
  params.lse_head_stride = varlen ? total_q : max_seqlen_q;
  params.batch = int(batch);
  params.heads = int(heads);
  params.heads_k = int(heads_k);
  params.head_dim = int(head_dim);
  params.seqlen_q = int(max_seqlen_q);
  params.seqlen_k = int(max_seqlen_k);
  params.cu_seqlens_q = varlen ? cu_seqlens_q->data_ptr<int>() : nullptr;
  params.cu_seqlens_k = varlen ? cu_seqlens_k->data_ptr<int>() : nullptr;
  params.softmax_scale = float(softmax_scale);
  params.softmax_scale_log2 = float(softmax_scale * M_LOG2E);
  params.is_causal = causal;
  params.dtype = dtype;
  cudaDeviceGetAttribute(&params.num_sms, cudaDevAttrMultiProcessorCount, q.get_device());

  const cudaError_t err = run_fwd_dispatch(params, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "flash_attn_cute: forward kernel launch failed: ", cudaGetErrorString(err));
  return lse;
}

}  // namespace flash_attn_cute
