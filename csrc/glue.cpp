// Torch-side checks and params filling shared by the forward and backward glue.
#include "glue.h"

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "flash_attn_cute/bounded_scores.h"
#include "flash_attn_cute/bwd_api.h"
#include "flash_attn_cute/fwd_api.h"
#include "flash_attn_cute/split_kv.h"
#include "flash_attn_cute/tile_size.h"

namespace flash_attn_cute {
namespace {

DType dtype_of(at::Tensor const& t) {
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
              "flash_attn_cute: q, k, v must be float16 or bfloat16, got ", c10::toString(t.scalar_type()));
  return t.scalar_type() == at::kHalf ? DType::kFloat16 : DType::kBFloat16;
}

void check_cu_seqlens(std::optional<at::Tensor> const& cu, int64_t batch, at::Tensor const& q, char const* name) {
  TORCH_CHECK(cu->scalar_type() == at::kInt, "flash_attn_cute: ", name, " must be int32");
  TORCH_CHECK(cu->dim() == 1 && cu->size(0) == batch + 1, "flash_attn_cute: ", name, " must have shape (batch + 1,)");
  TORCH_CHECK(cu->is_contiguous() && cu->device() == q.device(), "flash_attn_cute: ", name,
              " must be contiguous and on q's device");
}

}  // namespace

Problem check_problem(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor const& out,
                      std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
                      int64_t max_seqlen_q, int64_t max_seqlen_k) {
  Problem p;
  p.varlen = cu_seqlens_q.has_value();
  TORCH_CHECK(p.varlen == cu_seqlens_k.has_value(),
              "flash_attn_cute: give both cu_seqlens_q and cu_seqlens_k or neither");
  const int rank = p.varlen ? 3 : 4;
  TORCH_CHECK(q.dim() == rank && k.dim() == rank && v.dim() == rank && out.dim() == rank,
              "flash_attn_cute: q, k, v, out must be ", num(rank), "-D");
  p.dtype = dtype_of(q);
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                  out.scalar_type() == q.scalar_type(),
              "flash_attn_cute: q, k, v, out must share one dtype");
  TORCH_CHECK(q.is_cuda() && k.device() == q.device() && v.device() == q.device() && out.device() == q.device(),
              "flash_attn_cute: q, k, v, out must be on the same CUDA device");
  TORCH_CHECK(k.sizes() == v.sizes(), "flash_attn_cute: k and v must have the same shape");
  TORCH_CHECK(out.sizes() == q.sizes(), "flash_attn_cute: out must have q's shape");

  TORCH_CHECK(!p.varlen || (cu_seqlens_q->dim() == 1 && cu_seqlens_q->size(0) >= 1),
              "flash_attn_cute: cu_seqlens_q must have shape (batch + 1,)");
  p.batch = p.varlen ? cu_seqlens_q->size(0) - 1 : q.size(0);
  p.heads = q.size(-2);
  p.heads_k = k.size(-2);
  p.head_dim = q.size(-1);
  p.total_q = q.size(0);
  TORCH_CHECK(k.size(-1) == p.head_dim, "flash_attn_cute: q and k must have the same head dim");
  TORCH_CHECK(p.head_dim % 8 == 0 && p.head_dim > 0 && p.head_dim <= kMaxHeadDim,
              "flash_attn_cute: head dim must be a multiple of 8 in [8, ", num(kMaxHeadDim), "], got ",
              num(p.head_dim));
  TORCH_CHECK(p.heads_k > 0 && p.heads % p.heads_k == 0, "flash_attn_cute: nheads must be a multiple of nheads_k");
  if (p.varlen) {
    check_cu_seqlens(cu_seqlens_q, p.batch, q, "cu_seqlens_q");
    check_cu_seqlens(cu_seqlens_k, p.batch, q, "cu_seqlens_k");
    TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, "flash_attn_cute: max_seqlen_q/k must be >= 0");
    p.seqlen_q = max_seqlen_q;
    p.seqlen_k = max_seqlen_k;
  } else {
    TORCH_CHECK(k.size(0) == p.batch, "flash_attn_cute: q and k must have the same batch size");
    p.seqlen_q = q.size(1);
    p.seqlen_k = k.size(1);
  }
  TORCH_CHECK(p.seqlen_q <= kMaxSeqlen && p.seqlen_k <= kMaxSeqlen, "flash_attn_cute: sequence lengths (max_seqlen_q/k "
              "in varlen mode) must be at most ", num(kMaxSeqlen), ", got ", num(p.seqlen_q), " and ", num(p.seqlen_k));
  TORCH_CHECK(p.batch <= 65535 && p.heads <= 65535, "flash_attn_cute: batch and nheads must be at most 65535");
  return p;
}

void check_launch(cudaError_t err, char const* what, int device, int64_t head_dim) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  if (err == cudaErrorLaunchOutOfResources && head_dim > 0) {
    TORCH_CHECK(false, "flash_attn_cute: the ", what, " for head dim ", head_dim,
                " needs more shared memory per block than this GPU's ", smem_per_block_optin(device) / 1024, " KB");
  }
  TORCH_CHECK(false, "flash_attn_cute: ", what, " launch failed: ", cudaGetErrorString(err));
}

int smem_per_block_optin(int device) {
  const char* env = std::getenv("FLASH_ATTN_CUTE_SMEM_LIMIT");
  const int limit = env != nullptr ? std::atoi(env) : 0;
  if (limit > 0) return limit;
  // Unset, empty or not a positive number: the device's own.
  int smem_optin = 0;
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return smem_optin;
}

void check_like(at::Tensor const& t, at::Tensor const& like, char const* name, char const* like_name) {
  TORCH_CHECK(t.sizes() == like.sizes() && t.scalar_type() == like.scalar_type() && t.device() == like.device(),
              "flash_attn_cute: ", name, " must have the shape, dtype and device of ", like_name);
}

TensorView view_of(at::Tensor const& t, bool varlen) {
  char const* problem = kernel_layout_problem(t);
  TORCH_CHECK(problem == nullptr, problem);
  TensorView view;
  view.ptr = t.data_ptr();
  const int o = varlen ? 1 : 0;
  view.batch_stride = varlen ? 0 : t.stride(0);
  view.row_stride = t.stride(1 - o);
  view.head_stride = t.stride(2 - o);
  return view;
}

int64_t check_block_table(at::Tensor const& block_table, at::Tensor const& q, int64_t batch, int64_t page_size) {
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.size(0) == batch &&
                  block_table.device() == q.device() && block_table.stride(-1) == 1,
              "flash_attn_cute: block_table must be a contiguous-rows int32 (batch, pages per sequence) tensor on q's "
              "device");
  TORCH_CHECK(page_size > 0 && page_size % 16 == 0, "flash_attn_cute: the page size must be a positive multiple of 16");
  const int64_t capacity = block_table.size(1) * page_size;
  TORCH_CHECK(capacity < (int64_t(1) << 31), "flash_attn_cute: the block table holds too many rows per sequence");
  return capacity;
}

void set_paged_kv(FwdParams& params, at::Tensor const& block_table, at::Tensor const& k, at::Tensor const& v) {
  params.k = view_of(k, false);
  params.v = view_of(v, false);
  params.kv_batch = int(k.size(0));
  params.block_table = block_table.data_ptr<int>();
  params.block_table_batch_stride = block_table.stride(0);
  params.page_size = int(k.size(1));
}

std::vector<int64_t> lse_shape(Problem const& p) {
  if (p.varlen) return {p.heads, p.total_q};
  return {p.batch, p.heads, p.seqlen_q};
}

std::vector<at::Tensor> choose_splits(FwdParams& params, Problem const& p, at::Tensor const& lse, int64_t requested) {
  if (params.dropout.p > 0.f) return {};  // training: the dropout kernels have no split-KV form
  const int kernel_head_dim = fwd_kernel_head_dim(int(p.head_dim));
  const FwdTileShape tile = fwd_split_tile_shape(kernel_head_dim);
  const int n_blocks = int((p.seqlen_k + tile.block_n - 1) / tile.block_n);
  // Decoding (at most two 16-row slabs of query rows, after GQA packing) always takes the split
  // kernel: the plain kernel's 128-row tile would spend its MMAs on empty rows.
  params.few_rows = p.seqlen_q <= 2 * tile.block_m;
  if (requested > 0) {
    params.num_splits = int(std::min<int64_t>({requested, int64_t(kMaxSplits), std::max(n_blocks, 1)}));
  } else {
    // Else the plain kernel when its grid already fills the SMs (one CTA each); else as many splits
    // as fill the split kernel's slots: CTAs per SM by shared memory, and by registers (255 each).
    const FwdTileShape plain = fwd_tile_shape(kernel_head_dim, params.is_causal);
    const int64_t plain_ctas = p.batch * p.heads * ((p.seqlen_q + plain.block_m - 1) / plain.block_m);
    int smem_per_sm = 0;
    cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, params.device);
    const int by_smem = smem_per_sm / (fwd_smem_bytes(tile, kernel_head_dim) + 1024);
    const int by_regs = 65536 / (256 * 32 * tile.n_warps);
    const int slots = params.num_sms * std::max(1, std::min(by_smem, by_regs));
    const int64_t ctas = p.batch * p.heads * ((p.seqlen_q + tile.block_m - 1) / tile.block_m);
    params.num_splits = !params.few_rows && 10 * plain_ctas >= 8 * params.num_sms
                            ? 1
                            // (capped where the heuristic's 10 * ctas stays an int; it returns 1 from far below)
                            : num_splits_heuristic(int(std::min<int64_t>(ctas, 1 << 26)), slots, n_blocks, kMaxSplits);
  }
  if (split_ctas(params.num_splits) <= 1) return {};  // merged within the CTA
  params.split_stride = lse.numel();
  // One allocation (each costs host time): the partial outputs, then their LSEs.
  const int64_t rows = int64_t(params.num_splits) * params.split_stride;
  at::Tensor accum = at::empty({rows * (kernel_head_dim + 1)}, lse.options());
  params.oaccum_ptr = accum.data_ptr<float>();
  params.lseaccum_ptr = params.oaccum_ptr + rows * kernel_head_dim;
  return {accum};
}

// One counter per (device, stream) that the kernel leaves at 0, so that a call neither allocates
// nor zeroes one (session 28: that was a tensor and a fill launch per call). Keyed by the stream's
// id (cudaStreamGetId: never reused within the process, unlike a destroyed stream's handle, whose
// kernels may still run), and at most kMaxStreamCounters of them; never freed (at exit, CUDA may be
// gone before static destructors run). A stream being captured into a graph gets a fresh zeroed
// counter: replays may run concurrently on other streams.
constexpr size_t kMaxStreamCounters = 64;

static at::Tensor stream_counters(at::Tensor const& q) {
  auto zeroed = [&] { return at::zeros({1}, q.options().dtype(at::kInt)); };  // on the launch's stream
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();  // the launch's
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusActive;
  unsigned long long stream_id = 0;
  const bool known = cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
                     (capture != cudaStreamCaptureStatusNone || cudaStreamGetId(stream, &stream_id) == cudaSuccess);
  if (!known) cudaGetLastError();  // a refused query is not the launch's error
  if (known && capture == cudaStreamCaptureStatusNone) {
    static std::mutex mutex;
    static auto* counters = new std::map<std::pair<int, unsigned long long>, at::Tensor>();
    std::lock_guard<std::mutex> lock(mutex);
    const auto key = std::make_pair(int(q.get_device()), stream_id);
    auto it = counters->find(key);
    if (it == counters->end() && counters->size() < kMaxStreamCounters) {
      it = counters->emplace(key, zeroed()).first;
    }
    if (it != counters->end()) return it->second;
  }
  return zeroed();
}

std::vector<at::Tensor> ws_scratch(FwdParams& params, Problem const& p, at::Tensor const& q) {
  // run_fwd_dispatch's test for the Hopper kernels: split-KV calls (decoding) need no counter.
  const bool ws = fwd_sm90_warp_specialized(fwd_kernel_head_dim(int(p.head_dim)));
  if (!params.use_sm90 || params.uses_split_kernel() || !ws) return {};
  at::Tensor counters = stream_counters(q);
  params.tile_counter = counters.data_ptr<int>();
  if (params.dtype != DType::kBFloat16 || params.softcap <= 0.f || !BoundedScores::listed(params.softmax_scale_log2)) {
    return {counters};
  }
  // Room for one entry per 64-row consumer of every tile: ceil(seqlen_q / kBlockM) * kBlockM / 64
  // is at most ceil(seqlen_q / 64) + 2 for the tiles of up to 192 rows. The count is zeroed per
  // call (a fill launch), not kept beside the tile counter: the listing and redo launches of calls
  // from two host threads on one stream may interleave.
  params.redo_capacity = (int64_t(params.seqlen_q + 63) / 64 + 2) * params.batch * params.heads;
  at::Tensor listed = at::zeros({1 + params.redo_capacity}, q.options().dtype(at::kInt));
  params.redo_tiles = listed.data_ptr<int>();
  return {counters, listed};
}

FwdRows forward_rows(Problem& p, at::Tensor const& q, at::Tensor const& out, ScoreMods const& mods) {
  FwdRows rows{p, false, q, out, {}, lse_shape(p)};
  rows.packed = pack_gqa_rows(p, rows.q, rows.out, mods);
  rows.lse = at::empty(lse_shape(p), q.options().dtype(at::kFloat));
  return rows;
}

bool pack_gqa_rows(Problem& p, at::Tensor& q, at::Tensor& out, ScoreMods const& mods) {
  if (p.varlen || p.seqlen_q != 1 || p.heads == p.heads_k) return false;
  if (mods.window_left >= 0 || mods.window_right >= 0 || mods.alibi_slopes || mods.dropout_p > 0.0) return false;
  const int64_t groups = p.heads / p.heads_k;
  auto packed = [&](at::Tensor const& t) {  // (batch, groups, heads_k, dim): one view op (each costs host time)
    return t.as_strided({p.batch, groups, p.heads_k, p.head_dim},
                        {t.stride(0), t.stride(2), groups * t.stride(2), t.stride(3)});
  };
  q = packed(q);
  out = packed(out);
  p.seqlen_q = groups;
  p.heads = p.heads_k;
  return true;
}

Window effective_window(Problem const& p, ScoreMods const& mods, bool causal) {
  auto bounded = [&](int64_t side) { return side < 0 || side >= p.seqlen_k ? -1 : int(side); };
  return Window{bounded(mods.window_left), causal ? 0 : bounded(mods.window_right)};
}

bool kernel_causal(ScoreMods const& mods, bool causal) { return causal || mods.window_right == 0; }

Variant kernel_variant(Problem const& p, ScoreMods const& mods, bool causal) {
  if (mods.dropout_p > 0.0) return Variant::kDropout;
  const bool score_mods = mods.softcap > 0.0 || mods.alibi_slopes.has_value() ||
                          window_needs_mods(effective_window(p, mods, causal), causal);
  return score_mods ? Variant::kScoreMods : Variant::kPlain;
}

void check_built(Problem const& p, ScoreMods const& mods, bool causal, at::Tensor const& q, bool backward) {
  const Variant variant = kernel_variant(p, mods, causal);
  const int kernel_head_dim = fwd_kernel_head_dim(int(p.head_dim));
  const bool built = backward ? bwd_is_built(p.dtype, kernel_head_dim, variant)
                              : fwd_is_built(p.dtype, kernel_head_dim, variant);
  // The Python layer's words (_ops._require_kernel), which the tests turn into a skip.
  TORCH_CHECK_NOT_IMPLEMENTED(
      built, "flash_attn_cute: this build has no ", backward ? "backward" : "forward", " kernel for ",
      p.dtype == DType::kFloat16 ? "fp16" : "bf16", ", head dim ", num(p.head_dim), " (kernel ", num(kernel_head_dim),
      "), causal=", causal ? "True" : "False",
      variant == Variant::kDropout     ? " with dropout"
      : variant == Variant::kScoreMods ? " with softcap / ALiBi / a local window"
                                       : "",
      "; rebuild with FLASH_ATTN_CUTE_HDIMS / FLASH_ATTN_CUTE_DTYPES / FLASH_ATTN_CUTE_PASSES / "
      "FLASH_ATTN_CUTE_SCORE_MODS / FLASH_ATTN_CUTE_DROPOUT");
}

void check_rng_state(at::Tensor const& rng_state, c10::Device device) {
  TORCH_CHECK(rng_state.scalar_type() == at::kLong && rng_state.numel() == 2 && rng_state.is_contiguous() &&
                  rng_state.device() == device && device.is_cuda(),
              "flash_attn_cute: rng_state must be the forward's contiguous int64 (2,) tensor on ", device.str());
}

void set_out_residual(FwdParams& params, std::optional<at::Tensor> const& out_residual, at::Tensor const& out,
                      bool varlen) {
  if (!out_residual) return;
  check_like(*out_residual, out, "out_residual", "out");
  params.o_residual = view_of(*out_residual, varlen);
}

void set_dropout(FwdParams& params, ScoreMods const& mods, std::optional<at::Tensor> const& rng_state,
                 at::Tensor const& q, bool backward) {
  if (mods.dropout_p == 0.0) return;
  TORCH_CHECK(mods.dropout_p > 0.0 && mods.dropout_p < 1.0, "flash_attn_cute: dropout_p must be in [0, 1)");
  TORCH_CHECK(rng_state, "flash_attn_cute: dropout needs rng_state");
  check_rng_state(*rng_state, q.device());
  DropoutParams& d = params.dropout;
  d.p = float(mods.dropout_p);
  d.rp = float(1.0 / (1.0 - mods.dropout_p));
  int64_t* state = rng_state->data_ptr<int64_t>();
  if (backward) {
    d.seed_ptr = state;
    d.offset_ptr = state + 1;
    return;
  }
  d.rng_state = state;
}

void draw_dropout_seed(FwdParams& params) {
  DropoutParams& d = params.dropout;
  if (d.p == 0.f) return;
  auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(std::nullopt,
                                                                   at::cuda::detail::getDefaultCUDAGenerator());
  at::PhiloxCudaState philox;
  {
    std::lock_guard<std::mutex> lock(gen->mutex_);
    philox = gen->philox_cuda_state(4);  // one counter value per call (dropout.h)
  }
  if (philox.captured_) {
    d.seed_ptr = philox.seed_.ptr;
    d.offset_ptr = philox.offset_.ptr;
    d.offset_extra = philox.offset_intragraph_;
  } else {
    d.seed = philox.seed_.val;
    d.offset = philox.offset_.val;
  }
}

// A varlen per-sequence key bound: a contiguous int32 (batch,) tensor on q's device.
int const* sequence_ints(std::optional<at::Tensor> const& t, Problem const& p, at::Tensor const& q, char const* name) {
  TORCH_CHECK(p.varlen, "flash_attn_cute: ", name, " needs the varlen form (cu_seqlens_q / cu_seqlens_k)");
  TORCH_CHECK(t->scalar_type() == at::kInt && t->dim() == 1 && t->size(0) == p.batch && t->is_contiguous() &&
                  t->device() == q.device(),
              "flash_attn_cute: ", name, " must be a contiguous int32 (batch,) tensor on q's device");
  return t->data_ptr<int>();
}

void set_seqused_k(FwdParams& params, Problem const& p, std::optional<at::Tensor> const& seqused_k,
                   at::Tensor const& q) {
  if (seqused_k) params.seqused_k = sequence_ints(seqused_k, p, q, "seqused_k");
}

void set_leftpad_k(FwdParams& params, Problem const& p, std::optional<at::Tensor> const& leftpad_k,
                   at::Tensor const& q) {
  if (!leftpad_k) return;
  TORCH_CHECK(!params.block_table, "flash_attn_cute: a paged K / V (block_table) takes no leftpad_k");
  TORCH_CHECK(params.dropout.p == 0.f, "flash_attn_cute: leftpad_k takes no dropout (it is for inference)");
  params.leftpad_k = sequence_ints(leftpad_k, p, q, "leftpad_k");
}

void set_score_mods(FwdParams& params, Problem const& p, ScoreMods const& mods, bool causal, at::Tensor const& q) {
  TORCH_CHECK(mods.window_left >= -1 && mods.window_right >= -1,
              "flash_attn_cute: window_size entries must be >= -1 (-1: unbounded)");
  TORCH_CHECK(mods.softcap >= 0.0, "flash_attn_cute: softcap must be >= 0");
  params.window = effective_window(p, mods, causal);
  if (mods.softcap > 0.0) {
    params.softcap = float(params.score_scale / mods.softcap);
    params.softmax_scale = float(mods.softcap);
    params.softmax_scale_log2 = float(mods.softcap * M_LOG2E);
  }
  // As validation.py checks: an infinite (or NaN) factor would make every score NaN.
  TORCH_CHECK(std::isfinite(params.softmax_scale_log2) && std::isfinite(params.softcap),
              "flash_attn_cute: softmax_scale, softcap and softmax_scale / softcap times log2(e) must be finite in "
              "float32");
  if (mods.alibi_slopes) {
    at::Tensor const& slopes = *mods.alibi_slopes;
    TORCH_CHECK(slopes.scalar_type() == at::kFloat && slopes.device() == q.device() && slopes.stride(-1) == 1,
                "flash_attn_cute: alibi_slopes must be a float32 tensor on q's device with a contiguous last dim");
    TORCH_CHECK((slopes.dim() == 1 && slopes.size(0) == p.heads) ||
                    (slopes.dim() == 2 && slopes.size(0) == p.batch && slopes.size(1) == p.heads),
                "flash_attn_cute: alibi_slopes must have shape (nheads,) or (batch, nheads)");
    params.alibi_slopes = slopes.data_ptr<float>();
    params.alibi_batch_stride = slopes.dim() == 2 ? slopes.stride(0) : 0;
  }
}

void fill_params(FwdParams& params, Problem const& p, at::Tensor const& q, at::Tensor const& k,
                 at::Tensor const& v, at::Tensor const& out, at::Tensor const& lse,
                 std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
                 double softmax_scale, bool causal) {
  params.q = view_of(q, p.varlen);
  params.k = view_of(k, p.varlen);
  params.v = view_of(v, p.varlen);
  params.o = view_of(out, p.varlen);
  params.softmax_lse_ptr = lse.data_ptr<float>();
  params.lse_batch_stride = p.varlen ? 0 : p.heads * p.seqlen_q;
  params.lse_head_stride = p.varlen ? p.total_q : p.seqlen_q;
  params.batch = int(p.batch);
  params.heads = int(p.heads);
  params.heads_k = int(p.heads_k);
  params.head_dim = int(p.head_dim);
  params.seqlen_q = int(p.seqlen_q);
  params.seqlen_k = int(p.seqlen_k);
  params.cu_seqlens_q = p.varlen ? cu_seqlens_q->data_ptr<int>() : nullptr;
  params.cu_seqlens_k = p.varlen ? cu_seqlens_k->data_ptr<int>() : nullptr;
  params.total_q = p.varlen ? p.total_q : 0;
  params.total_k = p.varlen ? k.size(0) : 0;
  params.softmax_scale = float(softmax_scale);
  params.softmax_scale_log2 = float(softmax_scale * M_LOG2E);
  params.score_scale = float(softmax_scale);
  params.is_causal = causal;
  params.window = {-1, causal ? 0 : -1};  // set_score_mods adds the caller's window
  params.dtype = p.dtype;
  params.device = q.get_device();
  cudaDeviceGetAttribute(&params.num_sms, cudaDevAttrMultiProcessorCount, params.device);
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, params.device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, params.device);
  TORCH_CHECK(major >= 8, "flash_attn_cute: compute capability 8.0 or newer needed, got ", num(major), ".",
              num(minor));
  params.cc_major = major;
  params.smem_optin = smem_per_block_optin(params.device);
  // FLASH_ATTN_CUTE_SM90=0 keeps Hopper on the SM80 kernels (read at every call: A/B in one process).
  const char* sm90 = std::getenv("FLASH_ATTN_CUTE_SM90");
  params.use_sm90 = major == 9 && minor == 0 && !(sm90 != nullptr && std::string(sm90) == "0");
  const char* sm90_ws = std::getenv("FLASH_ATTN_CUTE_SM90_WS");
  params.sm90_ws = sm90_ws == nullptr ? -1 : std::string(sm90_ws) == "1" ? 1 : std::string(sm90_ws) == "0" ? 0 : -1;
  const char* consumers = std::getenv("FLASH_ATTN_CUTE_SM90_WS_CONSUMERS");
  params.sm90_ws_consumers = consumers == nullptr ? 0 : std::string(consumers) == "2" ? 2 : std::string(consumers) == "3" ? 3 : 0;
}

}  // namespace flash_attn_cute
