// The plain parameter block every forward kernel reads. Torch-free: raw pointers, 64-bit strides
// (in elements), sizes as ints. The torch glue in csrc/ fills it; C++ harnesses can fill it too.
#pragma once

#include <cstdint>

#include "tile_size.h"  // Variant

#if defined(__CUDACC__)
#define FLASH_PARAMS_HOST_DEVICE __host__ __device__
#else
#define FLASH_PARAMS_HOST_DEVICE
#endif

namespace flash_attn_cute {

using index_t = int64_t;

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };

// The warp-specialized forward's passes for bf16 softcap's larger caps (FwdParams::redo_tiles).
enum class RedoPass : int { kNone = 0, kList = 1, kRedo = 2 };

// The keys a query row sees: row i sees key j iff 0 <= j < seqlen_k and
//   i + diag - left <= j <= i + diag + right,   diag = seqlen_k - seqlen_q
// (bottom-right aligned, flash-attn >= 2.1), where a negative side is unbounded. Causal is
// right = 0; (-1, -1) is full attention.
struct Window {
  int left = -1;
  int right = -1;
};

// Where one tensor of shape (batch, seqlen, heads, dim) lives. In varlen mode the batch stride is
// unused: rows of sequence b start at cu_seqlens[b] of a (total, heads, dim) tensor.
struct TensorView {
  void* ptr = nullptr;
  index_t batch_stride = 0;
  index_t row_stride = 0;
  index_t head_stride = 0;
};

// Dropout of the attention probabilities (dropout.h): off when p == 0. The RNG stream is (seed,
// offset), read from *seed_ptr and *offset_ptr + offset_extra when seed_ptr is set (torch's
// generator inside a CUDA graph capture; the backward reading the forward's rng_state).
struct DropoutParams {
  float p = 0.f;   // the probability of dropping an entry
  float rp = 1.f;  // 1 / (1 - p): the scale of the kept entries
  uint64_t seed = 0;
  uint64_t offset = 0;
  const int64_t* seed_ptr = nullptr;
  const int64_t* offset_ptr = nullptr;
  uint64_t offset_extra = 0;
  int64_t* rng_state = nullptr;  // the forward writes the (seed, offset) it used here (int64 x 2)
};

// Whether a window needs the score-mod kernels. The causal kernels take a left window at run time
// (their masked steps check both edges; the host sends windows (left, 0) to them); the non-causal
// ones see a compile-time full mask.
FLASH_PARAMS_HOST_DEVICE inline bool window_needs_mods(Window window, bool is_causal) {
  return !is_causal && (window.left >= 0 || window.right >= 0);
}

struct FwdParams {
  TensorView q, k, v, o;

  // softmax_lse: (batch, heads, seqlen_q) fp32, or (heads, total_q) in varlen mode.
  float* softmax_lse_ptr = nullptr;
  index_t lse_batch_stride = 0;  // unused in varlen mode (rows start at cu_seqlens_q[b])
  index_t lse_head_stride = 0;

  int batch = 0;
  int heads = 0;
  int heads_k = 0;             // heads % heads_k == 0; query head h reads K/V head h / (heads / heads_k)
  int head_dim = 0;            // the real head dim: a multiple of 8, at most the kernel's kHeadDim
  int seqlen_q = 0;            // max_seqlen_q in varlen mode
  int seqlen_k = 0;            // max_seqlen_k in varlen mode; the cache capacity in rows when paged

  // Varlen: int32 prefix sums of length batch + 1, or nullptr for fixed-length batches; total_q /
  // total_k: the rows of q and of k / v (unread when paged), which every sequence's rows are cut to
  // (BlockInfo): cu_seqlens on the device go unchecked, and wrong ones must not reach past them.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  index_t total_q = 0;
  index_t total_k = 0;

  // Keys in use per sequence, all optional (nullptr: none). seqused_k[b]: sequence b uses its first
  // seqused_k[b] key rows (the KV cache's cache_seqlens + new keys). leftpad_k[b]: its keys start
  // at row leftpad_k[b] (and it uses seqused_k[b] - leftpad_k[b] of them). kv_batch_idx[b]: the
  // batch entry of k / v that sequence b reads. Lengths are cut to [0, seqlen_k] and an index out
  // of [0, kv_batch) gives the sequence no keys: the kernels never read outside k and v.
  const int* seqused_k = nullptr;
  const int* leftpad_k = nullptr;
  const int* kv_batch_idx = nullptr;
  int kv_batch = 0;  // k's and v's first dimension: batch entries, or pages when paged

  // Paged K / V (read by the split-KV kernel): key row r of sequence b is row r % page_size of page
  // block_table[b * block_table_batch_stride + r / page_size]; k.batch_stride is the page stride.
  // A page index outside [0, kv_batch) reads as zeros.
  const int* block_table = nullptr;
  index_t block_table_batch_stride = 0;
  int page_size = 0;

  float softmax_scale = 0.f;       // applied to the scores by the softmax (the cap under softcap)
  float softmax_scale_log2 = 0.f;  // softmax_scale * log2(e): the kernel exponentiates with exp2
  float score_scale = 0.f;         // the scale of q.k in the logits (the gradients' scale)

  // Score transforms (flash-attn 2.x), all off by default. The logit of (row i, key j) is
  //   cap * tanh(q.k * score_scale / cap)   (softcap > 0; softcap = score_scale / cap), else q.k * score_scale,
  // minus alibi_slopes[b * alibi_batch_stride + h] * |i + seqlen_k - seqlen_q - j| when alibi_slopes
  // is given, with the keys outside `window` hidden.
  Window window;
  float softcap = 0.f;
  const float* alibi_slopes = nullptr;
  index_t alibi_batch_stride = 0;

  // Softcap, ALiBi and a window on a non-causal kernel run in their own kernel instantiations
  // (Variant::kScoreMods): the plain kernels spend no register on them.
  FLASH_PARAMS_HOST_DEVICE bool has_score_mods() const {
    return softcap > 0.f || alibi_slopes != nullptr || window_needs_mods(window, is_causal);
  }

  // The window a kernel instantiation applies: the score-mod and dropout kernels (Has_mods) take
  // `window` as is; the plain kernels see the right edge (causal or none) as a compile-time
  // constant, and the causal ones take a left window at run time.
  template <bool Has_mods, bool Is_causal>
  FLASH_PARAMS_HOST_DEVICE Window kernel_window() const {
    return Has_mods ? window : Window{Is_causal ? window.left : -1, Is_causal ? 0 : -1};
  }

  // The ALiBi slope of (batch entry, head) in units of the softmax scale (the kernels' scores), or
  // 0 without ALiBi.
  FLASH_PARAMS_HOST_DEVICE float alibi_slope_scaled(int bidb, int bidh) const {
    return alibi_slopes ? alibi_slopes[bidb * alibi_batch_stride + bidh] / softmax_scale : 0.f;
  }

  DropoutParams dropout;
  // Dropout training: O - O_rounded in the element type, laid out like o (ptr nullptr: not written).
  // The backward's D = rowsum(dO * (O + residual)) then carries no rounding error of O.
  TensorView o_residual;

  // The instantiation a call needs.
  FLASH_PARAMS_HOST_DEVICE Variant variant() const {
    return dropout.p > 0.f ? Variant::kDropout : has_score_mods() ? Variant::kScoreMods : Variant::kPlain;
  }

  bool is_causal = false;
  DType dtype = DType::kBFloat16;
  int num_sms = 0;  // read off the device by the caller; used by launch heuristics
  int device = 0;   // the CUDA device the launch runs on
  int cc_major = 0;  // its compute capability's major version
  // The shared memory it allows a block (its opt-in limit; FLASH_ATTN_CUTE_SMEM_LIMIT overrides it,
  // for tests): GPUs that allow less than a kernel's tiles take run it on small tiles
  // (fwd_small_smem, bwd_small_smem in tile_size.h).
  int smem_optin = 0;
  // The device is a Hopper (compute capability 9.0) and the caller allows the Hopper forward
  // (fwd_kernel_sm90.h), which then runs the plain variant's whole launches.
  bool use_sm90 = false;
  // Among those, the warp-specialized kernel (fwd_kernel_sm90_ws.h): -1 where it pays
  // (fwd_sm90_ws_pays), 0 never, 1 wherever it is built (FLASH_ATTN_CUTE_SM90_WS, for A / B and tests).
  int sm90_ws = -1;
  // Its consumer warpgroups where a kernel comes with two and three (tile_size.h): 0 where
  // fwd_sm90_ws_three_consumers_pay says, 2 or 3 (FLASH_ATTN_CUTE_SM90_WS_CONSUMERS, for A / B and tests).
  int sm90_ws_consumers = 0;
  // Set by its launch: the warp-specialized kernel loads Q, K and V by TMA (fwd_ws_tma_fits).
  bool ws_tma = false;
  // The warp-specialized kernel's tile counter (one int, 0 before a launch and left at 0 by it):
  // CTAs take their next tile from it (fwd_kernel_sm90_ws.h). The caller gives it wherever that
  // kernel may run.
  int* tile_counter = nullptr;

  // Split-KV (num_splits > 1): split s of a query row block walks its share of the key blocks and
  // writes its own O (fp32, normalised by its own sum) and LSE (-inf when it saw no key) for row r
  // of softmax_lse's layout at oaccum_ptr[(s * split_stride + r) * kernel head dim + col] and
  // lseaccum_ptr[s * split_stride + r]; the combine kernel merges them into o and softmax_lse.
  // The split-KV kernel also runs with num_splits == 1 (for a paged cache, or few_rows) and then
  // writes o and softmax_lse itself.
  int num_splits = 1;
  bool few_rows = false;  // decoding (a few query rows): the split kernel's 16-row tile, split or not
  float* oaccum_ptr = nullptr;
  float* lseaccum_ptr = nullptr;
  index_t split_stride = 0;  // the number of softmax_lse elements

  // The split-KV kernel is needed for more than one split or a paged cache.
  FLASH_PARAMS_HOST_DEVICE bool uses_split_kernel() const {
    return num_splits > 1 || few_rows || block_table != nullptr;
  }

  // bf16 softcap's caps past BoundedScores::fits, up to BoundedScores::kMaxListedScaleLog2
  // (run_fwd_sm90_ws): the fixed-offset kernel runs first and lists in redo_tiles each tile with a
  // row whose largest term may fall below 2^kLeastLog2 (RedoPass::kList), then the checked kernel
  // redoes the listed tiles (kRedo). redo_tiles: the count (0 before the first launch), then room
  // for redo_capacity tiles (one per consumer of each tile), the call's own: calls from other host
  // threads on the same stream may interleave their launches. Without it such caps take the checked
  // kernel alone.
  int* redo_tiles = nullptr;
  int64_t redo_capacity = 0;
  RedoPass redo_pass = RedoPass::kNone;  // set per launch by run_fwd_sm90_ws
};

// The backward reads everything the forward did (q, k, v, o, softmax_lse, sizes, scales) plus:
struct BwdParams : FwdParams {
  TensorView dout, dq, dk, dv;  // dk, dv: (batch, seqlen_k, heads_k, dim), summed over each group

  // D = rowsum(dO * O), fp32, laid out exactly like softmax_lse (same strides).
  float* dsoftmax_sum_ptr = nullptr;
  // fp32 dQ accumulator (unscaled), padded: (batch, heads, seqlen_q rounded up to block_m, row),
  // or (heads, total_q + batch * block_m, row) with sequence b starting at row cu_seqlens_q[b] +
  // b * block_m; a row is the kernel head dim (dq_accum_row_floats, bwd_api.h). Every query row
  // block thus owns block_m whole, contiguous rows, its tile, and the kernel adds full tiles (in
  // fragment order) without row checks. Strides in floats.
  float* dq_accum_ptr = nullptr;
  index_t dq_accum_batch_stride = 0;  // unused in varlen mode
  index_t dq_accum_row_stride = 0;
  index_t dq_accum_head_stride = 0;
  int dq_accum_varlen_pad = 0;  // rows added before each sequence in varlen mode: b * pad

  // deterministic: each query row block takes its dQ tiles in a fixed order of key blocks
  // (block_info.h), kept by one int32 counter per (batch, head, query row block) that the
  // preprocess kernel seeds. dK and dV are always deterministic.
  bool deterministic = false;
  int* dq_semaphore = nullptr;  // (batch, heads, ceil_div(seqlen_q, block_m))
  // Deterministic, not causal and no window, with the key blocks of a head few enough to run at
  // once (bwd_dq_rotate, bwd_api.h): where a sequence has no more key blocks than row blocks, the
  // key blocks walk their row blocks rotated and each row block takes their dQ tiles in the order
  // they reach it (dq_rotated, block_info.h), so none waits for another in the steady state.
  bool dq_rotate = false;
  // The SM80 backward on bwd_tile_shape's small tiles (bwd_small_smem). Never the Hopper backward.
  bool small_smem = false;
  // Among those, bwd_v_in_regs_tile_shape's (bwd_v_in_regs: head dim 256 on sm_86 / sm_89, no dropout).
  bool v_in_regs = false;
  // Set by its launch: the Hopper backward loads Q and dO by TMA (bwd_sm90_tma.h).
  bool sm90_tma = false;

  // The epilogues' scales: dQ = ds_scale() dS K, dK = ds_scale() dS^T Q, dV = dv_scale() P^T dO
  // with the main loop's dS (the logits' gradient, which score_scale makes that of q.k) and P.
  // With dropout the main loop leaves the 1 / (1 - p) of the kept entries out of both (bwd_kernel.h).
  FLASH_PARAMS_HOST_DEVICE float ds_scale() const { return score_scale * dropout.rp; }
  FLASH_PARAMS_HOST_DEVICE float dv_scale() const { return dropout.rp; }
};

}  // namespace flash_attn_cute
