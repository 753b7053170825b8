// Torch glue for flash_attn_with_kvcache, one op per call (an eager decoder pays its host time once
// per layer and token): the row copies that append new keys / values (and rotate q), then the
// forward over a dense, batch-indexed or paged cache. The op checks every argument before its first
// launch, so flash_attn_cute/kvcache.py runs its own checks only to name the problem when it raises.
// Nothing here reads a device tensor, so a decode step can be captured in a CUDA graph.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "flash_attn_cute/fwd_api.h"
#include "flash_attn_cute/rotary_copy.h"
#include "flash_attn_cute/split_kv.h"
#include "glue.h"
#include "torch_api.h"

namespace flash_attn_cute {
namespace {

// An int32 tensor of shape (batch,) (or (batch, n) for the block table) on `like`'s device.
int const* int_ptr(std::optional<at::Tensor> const& t, at::Tensor const& like, int64_t batch, int dims, char const* name) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kInt && t->dim() == dims && t->size(0) == batch, "flash_attn_cute: ", name,
              " must be an int32 tensor with ", num(dims), " dims and batch ", num(batch), " rows");
  TORCH_CHECK(t->device() == like.device() && t->stride(-1) == 1, "flash_attn_cute: ", name,
              " must be on q's device with a contiguous last dimension");
  return t->data_ptr<int>();
}

// A (batch-or-pages, rows, heads, head_dim) cache tensor of q's dtype and device.
void check_cache(at::Tensor const& t, at::Tensor const& q, char const* name) {
  TORCH_CHECK(t.dim() == 4 && t.scalar_type() == q.scalar_type() && t.device() == q.device(), "flash_attn_cute: ",
              name, " must be a 4-D tensor with q's dtype and device");
}

// src's rows into dst (row_base[b] + i of dst entry dst_batch_idx[b] or of block_table's pages),
// rotated by cos / sin at pos_base[b] (+ i when pos_per_row) when given.
RowCopy row_copy_of(at::Tensor const& src, at::Tensor const& dst, int64_t batch, std::optional<at::Tensor> const& row_base,
                    std::optional<at::Tensor> const& dst_batch_idx, std::optional<at::Tensor> const& block_table,
                    std::optional<at::Tensor> const& cos, std::optional<at::Tensor> const& sin,
                    std::optional<at::Tensor> const& pos_base, bool interleaved, bool pos_per_row, char const* name,
                    char const* dst_name) {
  TORCH_CHECK(src.dim() == 4 && src.size(0) == batch, "flash_attn_cute: ", name,
              " must be a 4-D tensor with ", num(batch), " sequences");
  check_cache(dst, src, dst_name);
  TORCH_CHECK(dst.size(2) == src.size(2) && dst.size(3) == src.size(3), "flash_attn_cute: ", name,
              " and ", dst_name, " must have the same heads and head dim");
  RowCopy copy;
  copy.src = view_of(src, false);
  copy.dst = view_of(dst, false);
  copy.rows = int(src.size(1));
  copy.heads = int(src.size(2));
  copy.row_base = int_ptr(row_base, src, batch, 1, "cache_seqlens");
  copy.dst_batch_idx = int_ptr(dst_batch_idx, src, batch, 1, "cache_batch_idx");
  copy.block_table = int_ptr(block_table, src, batch, 2, "block_table");
  copy.dst_batch = int(dst.size(0));
  if (copy.block_table) {
    copy.block_table_batch_stride = block_table->stride(0);
    copy.page_size = int(dst.size(1));
    copy.dst_rows = int(block_table->size(1) * dst.size(1));
  } else {
    TORCH_CHECK(copy.dst_batch_idx || dst.size(0) == batch, "flash_attn_cute: ", name,
                ": batch mismatch");
    copy.dst_rows = int(dst.size(1));
  }
  if (cos.has_value()) {
    copy.rotary_dim = int(2 * cos->size(1));
    copy.cos = cos->data_ptr();
    copy.sin = sin->data_ptr();
    copy.seqlen_ro = int(cos->size(0));
    copy.interleaved = interleaved;
    copy.pos_base = int_ptr(pos_base, src, batch, 1, "cache_seqlens");
    copy.pos_per_row = pos_per_row;
  }
  return copy;
}

// A decode step's append, checked (not launched): k and v (batch, rows, heads_k, dim) into the caches
// at row cache_seqlens[b] (k rotated by cos / sin when given), q rotated into q_rotated (when given)
// at cache_seqlens[b] (+ its row when q_per_row), and seqused_k[b] = cache_seqlens[b] + rows.
RowCopyParams append_params(int64_t batch, at::Tensor const& k, at::Tensor const& v, at::Tensor& k_cache,
                            at::Tensor& v_cache, at::Tensor const& cache_seqlens,
                            std::optional<at::Tensor> const& cache_batch_idx,
                            std::optional<at::Tensor> const& block_table, std::optional<at::Tensor> const& cos,
                            std::optional<at::Tensor> const& sin, bool interleaved, at::Tensor const& q,
                            std::optional<at::Tensor> const& q_rotated, bool q_per_row, at::Tensor const& seqused_k) {
  TORCH_CHECK(k.dim() == 4 && k.size(0) == batch && k.scalar_type() == q.scalar_type() && k.device() == q.device(),
              "flash_attn_cute: k must be a 4-D tensor of q's batch, dtype and device");
  TORCH_CHECK(v.sizes() == k.sizes(), "flash_attn_cute: k and v must have the same shape");
  RowCopyParams params;
  params.batch = int(batch);
  params.head_dim = int(k.size(3));
  params.dtype = k.scalar_type() == at::kHalf ? DType::kFloat16 : DType::kBFloat16;
  params.copy[0] = row_copy_of(k, k_cache, batch, cache_seqlens, cache_batch_idx, block_table, cos, sin, cache_seqlens,
                               interleaved, true, "k", "k_cache");
  params.copy[1] = row_copy_of(v, v_cache, batch, cache_seqlens, cache_batch_idx, block_table, std::nullopt,
                               std::nullopt, std::nullopt, false, true, "v", "v_cache");
  params.copies = 2;
  if (cos.has_value()) {
    for (auto const* t : {&*cos, &*sin}) {
      TORCH_CHECK(t->dim() == 2 && t->is_contiguous() && t->scalar_type() == k.scalar_type() &&
                      t->device() == k.device() && t->sizes() == cos->sizes(),
                  "flash_attn_cute: rotary_cos / rotary_sin must be contiguous (seqlen_ro, rotary_dim / 2) tensors "
                  "of q's dtype and device");
    }
    TORCH_CHECK(cos->size(1) > 0 && 2 * cos->size(1) % 16 == 0 && 2 * cos->size(1) <= k.size(3),
                "flash_attn_cute: rotary_dim must be a multiple of 16 in [16, head dim]");
    TORCH_CHECK(cos->size(0) >= params.copy[0].dst_rows, "flash_attn_cute: rotary_cos / rotary_sin need a position "
                "for each of the cache's ", num(params.copy[0].dst_rows), " rows per sequence");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(cos->data_ptr()) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(sin->data_ptr()) % 16 == 0,
                "flash_attn_cute: rotary_cos / rotary_sin must be 16-byte aligned");
  }
  if (q_rotated.has_value()) {
    params.copy[params.copies++] = row_copy_of(q, *q_rotated, batch, std::nullopt, std::nullopt, std::nullopt, cos,
                                               sin, cache_seqlens, interleaved, q_per_row, "q", "q_rotated");
  }
  params.rows_end = const_cast<int*>(int_ptr(seqused_k, k, batch, 1, "seqused_k"));
  return params;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fwd_kvcache(
    at::Tensor const& q, at::Tensor& k_cache, at::Tensor& v_cache, std::optional<at::Tensor> const& k,
    std::optional<at::Tensor> const& v, std::optional<at::Tensor> const& rotary_cos,
    std::optional<at::Tensor> const& rotary_sin, std::optional<at::Tensor> const& cache_seqlens, int64_t cache_rows,
    std::optional<at::Tensor> const& cache_batch_idx, std::optional<at::Tensor> const& leftpad_k,
    std::optional<at::Tensor> const& block_table, double softmax_scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap, bool rotary_interleaved, std::optional<at::Tensor> const& alibi_slopes,
    int64_t num_splits) {
  const ScoreMods mods{window_left, window_right, softcap, alibi_slopes};
  causal = kernel_causal(mods, causal);
  TORCH_CHECK(q.dim() == 4 && q.is_cuda(), "flash_attn_cute: q must be a 4-D CUDA tensor");
  check_cache(k_cache, q, "k_cache");
  check_cache(v_cache, q, "v_cache");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "flash_attn_cute: k_cache and v_cache must have the same shape");
  Problem p;
  p.varlen = false;
  p.dtype = q.scalar_type() == at::kHalf ? DType::kFloat16 : DType::kBFloat16;
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
              "flash_attn_cute: q must be float16 or bfloat16");
  p.batch = q.size(0);
  p.seqlen_q = q.size(1);
  p.total_q = p.batch * p.seqlen_q;
  p.heads = q.size(2);
  p.head_dim = q.size(3);
  p.heads_k = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == p.head_dim, "flash_attn_cute: q and k_cache must have the same head dim");
  TORCH_CHECK(p.head_dim % 8 == 0 && p.head_dim > 0 && p.head_dim <= kMaxHeadDim,
              "flash_attn_cute: head dim must be a multiple of 8 in [8, ", num(kMaxHeadDim), "]");
  TORCH_CHECK(p.heads_k > 0 && p.heads % p.heads_k == 0, "flash_attn_cute: nheads must be a multiple of nheads_k");
  TORCH_CHECK(p.batch <= 65535 && p.heads <= 65535, "flash_attn_cute: batch and nheads must be at most 65535");
  p.seqlen_k = block_table ? check_block_table(*block_table, q, p.batch, k_cache.size(1)) : k_cache.size(1);
  TORCH_CHECK(p.seqlen_q <= kMaxSeqlen && p.seqlen_k <= kMaxSeqlen,
              "flash_attn_cute: q's rows and the cache's rows per sequence must be at most ", num(kMaxSeqlen));
  TORCH_CHECK(k.has_value() == v.has_value(), "flash_attn_cute: give both k and v or neither");
  TORCH_CHECK(rotary_cos.has_value() == rotary_sin.has_value(),
              "flash_attn_cute: give both rotary_cos and rotary_sin or neither");
  TORCH_CHECK(!rotary_cos || k, "flash_attn_cute: rotary_cos / rotary_sin rotate the new keys: give k and v too");
  TORCH_CHECK(num_splits <= kMaxSplits, "flash_attn_cute: num_splits must be at most ", num(kMaxSplits));
  const int64_t seqlen_new = k && k->dim() == 4 ? k->size(1) : 0;
  TORCH_CHECK(cache_seqlens || (cache_rows >= 0 && cache_rows <= p.seqlen_k - seqlen_new), "flash_attn_cute: "
              "cache_seqlens (", num(cache_rows), ") + the new keys (", num(seqlen_new), ") exceed the cache capacity (",
              num(p.seqlen_k), ")");
  // The per-sequence tensors, whether or not the attention runs (q may have no rows).
  if (cache_seqlens) int_ptr(cache_seqlens, q, p.batch, 1, "cache_seqlens");
  int const* const leftpad_ptr = int_ptr(leftpad_k, q, p.batch, 1, "cache_leftpad");
  int const* const batch_idx_ptr = int_ptr(cache_batch_idx, q, p.batch, 1, "cache_batch_idx");
  TORCH_CHECK(cache_batch_idx || block_table || k_cache.size(0) == p.batch,
              "flash_attn_cute: k_cache batch must equal q batch (or give cache_batch_idx / block_table)");
  TORCH_CHECK(!block_table || (!leftpad_k && !cache_batch_idx),
              "flash_attn_cute: a paged cache (block_table) takes neither cache_leftpad nor cache_batch_idx");
  check_built(p, mods, causal, q);

  // Every argument is checked before the first launch that writes the caller's tensors: a call
  // that raises a check has written nothing. (The attention's launch can still fail after the
  // append, on a GPU whose shared memory this build has no tiles for: an error, with the rows
  // appended.)
  c10::cuda::CUDAGuard device_guard(q.device());
  // The rows in use before the append: cache_seqlens, else cache_rows in every sequence.
  const at::Tensor seqlens =
      cache_seqlens ? *cache_seqlens : at::full({p.batch}, cache_rows, q.options().dtype(at::kInt));
  at::Tensor q_attend = q, seqused_k = seqlens;
  RowCopyParams append;  // no copies: nothing to append
  if (k) {
    // One launch appends k and v (k rotated), rotates q and writes the caches' new lengths. q's rows
    // sit after the cache's keys: at their own positions when causal or local (a window side
    // shorter than the cache), else all at the first (flash-attn 2.x).
    std::optional<at::Tensor> cos, sin, q_rotated;
    if (rotary_cos) {
      cos = rotary_cos->contiguous();
      sin = rotary_sin->contiguous();
      q_rotated = at::empty(q.sizes(), q.options());
      q_attend = *q_rotated;
    }
    const Window window = effective_window(p, mods, causal);
    const bool per_row = causal || window.left >= 0 || window.right >= 0;
    seqused_k = at::empty({p.batch}, q.options().dtype(at::kInt));
    append = append_params(p.batch, *k, *v, k_cache, v_cache, seqlens, cache_batch_idx, block_table, cos, sin,
                           rotary_interleaved, q, q_rotated, per_row, seqused_k);
  }
  at::Tensor out = at::empty(q.sizes(), q.options());
  FwdRows rows = forward_rows(p, q_attend, out, mods);
  const bool attend = p.batch > 0 && p.seqlen_q > 0 && p.heads > 0;
  FwdParams params;
  std::vector<at::Tensor> split_buffers, scratch;
  if (attend) {
    fill_params(params, p, rows.q, k_cache, v_cache, rows.out, rows.lse, std::nullopt, std::nullopt, softmax_scale,
                causal && !rows.packed);
    set_score_mods(params, rows.unpacked, mods, causal && !rows.packed, q);
    params.seqused_k = int_ptr(seqused_k, q, p.batch, 1, "cache_seqlens");
    params.leftpad_k = leftpad_ptr;
    params.kv_batch_idx = batch_idx_ptr;
    params.kv_batch = int(k_cache.size(0));
    if (block_table) set_paged_kv(params, *block_table, k_cache, v_cache);
    split_buffers = choose_splits(params, p, rows.lse, std::max<int64_t>(num_splits, 0));
    scratch = ws_scratch(params, p, q);
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  if (append.copies > 0) check_launch(run_rotary_copy(append, stream), "append (rotary_copy)");
  if (attend) check_launch(run_fwd_dispatch(params, stream), "forward kernel", params.device, p.head_dim);
  return {out, rows.caller_lse()};
}

}  // namespace flash_attn_cute
