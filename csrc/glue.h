// Torch-side checks and params filling shared by the forward and backward glue. These keep a direct
// torch.ops call from reaching a kernel with bad input; the Python layer names the problem (it checks
// first, or, for flash_attn_with_kvcache, when the op raises).
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>

#include "flash_attn_cute/params.h"

namespace flash_attn_cute {

// Numbers go into messages through std::to_string, never through an ostream: built with a newer
// GCC than the libstdc++ torch loads (the GPU image's /opt/gcc), inlined ostream number formatting
// crashes inside the extension (seen on the H200 machine, 2026-11-29).
inline std::string num(int64_t x) { return std::to_string(x); }

// The sizes of one attention problem, read off q and k (and cu_seqlens in varlen mode).
struct Problem {
  bool varlen;
  int64_t batch, heads, heads_k, head_dim, seqlen_q, seqlen_k, total_q;
  DType dtype;
};

// Checks q, k, v, out (out has q's shape) and the cu_seqlens; seqlen_q / seqlen_k are the max
// lengths in varlen mode.
Problem check_problem(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor const& out,
                      std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
                      int64_t max_seqlen_q, int64_t max_seqlen_k);

// A tensor of q's (or k's) shape and dtype, on q's device, with a layout the kernels take.
void check_like(at::Tensor const& t, at::Tensor const& like, char const* name, char const* like_name);
// The longest sequence (max_seqlen_q / _k in varlen mode) a call may give: the kernels count rows in
// int, rounded up to whole blocks.
inline constexpr int64_t kMaxSeqlen = (int64_t{1} << 31) - 1024;

// Raises "flash_attn_cute: <what> launch failed: ..." where err is not cudaSuccess, clearing the
// launch's error first: left set, it would fail the next, unrelated CUDA check (a caller that
// catches this exception carries on). With a head dim, cudaErrorLaunchOutOfResources (the kernel
// needs more shared memory than `device` allows a block, launch.h's allow_dynamic_smem) says so.
void check_launch(cudaError_t err, char const* what, int device = 0, int64_t head_dim = 0);

// The shared memory `device` allows a block (its opt-in limit), or FLASH_ATTN_CUTE_SMEM_LIMIT
// (bytes, read at every call) where set: the SM80 forward and backward then pick their tiles as on
// such a GPU (the tests run the small tiles of sm_86 / sm_89 on Hopper with it).
int smem_per_block_optin(int device);

// What keeps the kernels from reading t in place (view_of's layout: a contiguous last dimension,
// 16-byte aligned data, other strides multiples of 8 elements, or of size 1), or nullptr. Inline:
// the C++ autograd function (autograd.cpp) copies such inputs with it, also in its CPU tests.
inline char const* kernel_layout_problem(at::Tensor const& t) {
  if (t.stride(-1) != 1) return "flash_attn_cute: tensors must have a contiguous last dimension";
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return "flash_attn_cute: tensor data must be 16-byte aligned";
  for (int i = 0; i + 1 < t.dim(); ++i) {
    if (t.stride(i) % 8 != 0 && t.size(i) != 1) {
      return "flash_attn_cute: strides must be multiples of 8 elements (16 bytes)";
    }
  }
  return nullptr;
}

// (batch, seqlen, heads, dim), or (total, heads, dim) in varlen mode.
TensorView view_of(at::Tensor const& t, bool varlen);

// Fills the fields the forward and backward share. lse: (batch, heads, seqlen_q) or (heads, total_q).
void fill_params(FwdParams& params, Problem const& p, at::Tensor const& q, at::Tensor const& k,
                 at::Tensor const& v, at::Tensor const& out, at::Tensor const& lse,
                 std::optional<at::Tensor> const& cu_seqlens_q, std::optional<at::Tensor> const& cu_seqlens_k,
                 double softmax_scale, bool causal);

// flash-attn 2.x's optional score transforms, as the ops receive them, and dropout (not a score
// transform, but like one it picks the kernel variant and rules out packing GQA rows).
struct ScoreMods {
  int64_t window_left = -1;  // -1: unbounded
  int64_t window_right = -1;
  double softcap = 0.0;      // 0: off
  std::optional<at::Tensor> alibi_slopes;  // fp32 (heads,) or (batch, heads)
  double dropout_p = 0.0;    // 0: off
};

// Checks `mods` and sets params.window (causal sets window.right = 0; a side that reaches past
// seqlen_k is unbounded), the softcap scales and the ALiBi slopes. After fill_params.
void set_score_mods(FwdParams& params, Problem const& p, ScoreMods const& mods, bool causal, at::Tensor const& q);

// The window the kernels see: causal sets right = 0, a side that reaches past seqlen_k is unbounded.
Window effective_window(Problem const& p, ScoreMods const& mods, bool causal);

// Whether the call runs the causal kernels: causal, or a window (left, 0), the same bottom-right
// aligned mask with a left edge the causal kernels take at run time. The APIs set `causal` to it
// first: everything after sees one form of each mask.
bool kernel_causal(ScoreMods const& mods, bool causal);

// The instantiation the call needs (FwdParams::variant).
Variant kernel_variant(Problem const& p, ScoreMods const& mods, bool causal);

// This build has the forward (or backward) kernel the problem and its score mods need.
void check_built(Problem const& p, ScoreMods const& mods, bool causal, at::Tensor const& q, bool backward = false);

// rng_state: the forward's (seed, offset), a contiguous int64 (2,) tensor on `device` (a CUDA one).
void check_rng_state(at::Tensor const& rng_state, c10::Device device);
// Dropout training's rounding residual of out (FwdParams::o_residual), when given: shaped like out.
void set_out_residual(FwdParams& params, std::optional<at::Tensor> const& out_residual, at::Tensor const& out,
                      bool varlen);
// Dropout with probability mods.dropout_p. The forward draws (seed, offset) from torch's default CUDA
// generator (CUDA-graph safe; draw_dropout_seed) and its kernel writes them into rng_state (int64
// (2,) on q's device); the backward reads them from there.
void set_dropout(FwdParams& params, ScoreMods const& mods, std::optional<at::Tensor> const& rng_state,
                 at::Tensor const& q, bool backward);
// The forward's draw, after every check and allocation: a call that raises leaves the generator as it was.
void draw_dropout_seed(FwdParams& params);

// Varlen only: sequence b uses the first seqused_k[b] of its keys (int32 (batch,) on q's device).
void set_seqused_k(FwdParams& params, Problem const& p, std::optional<at::Tensor> const& seqused_k,
                   at::Tensor const& q);

// Varlen only (flash-attn 2.6+'s leftpad_k): sequence b's keys start leftpad_k[b] rows into its
// cu_seqlens_k range and end where it (or seqused_k[b]) does. Neither a paged K / V nor dropout
// takes it. Call after set_paged_kv and set_dropout.
void set_leftpad_k(FwdParams& params, Problem const& p, std::optional<at::Tensor> const& leftpad_k,
                   at::Tensor const& q);

// A paged K / V's block table: int32 (batch, pages per sequence) on q's device, with a contiguous
// last dim; page_size a positive multiple of 16. Returns the keys a sequence can hold.
int64_t check_block_table(at::Tensor const& block_table, at::Tensor const& q, int64_t batch, int64_t page_size);

// Points params.k / v at a paged cache (pages, page_size, heads_k, dim) read through block_table.
void set_paged_kv(FwdParams& params, at::Tensor const& block_table, at::Tensor const& k, at::Tensor const& v);

// softmax_lse's shape for a problem.
std::vector<int64_t> lse_shape(Problem const& p);

// The forward's rows: q and out as the kernels see them (GQA decode rows packed, see pack_gqa_rows),
// the problem before packing (for the score mods) and softmax_lse, allocated in the packed shape and
// returned to the caller as lse.view(lse_sizes).
struct FwdRows {
  Problem unpacked;
  bool packed;
  at::Tensor q, out, lse;
  std::vector<int64_t> lse_sizes;
  // lse in the caller's shape (a view only where the rows were packed: a view costs host time).
  at::Tensor caller_lse() const { return packed ? lse.view(lse_sizes) : lse; }
};
FwdRows forward_rows(Problem& p, at::Tensor const& q, at::Tensor const& out, ScoreMods const& mods);

// Sets params.num_splits for the split-KV forward: `requested` > 0 asks for that many (at most
// one per key block), 0 lets num_splits_heuristic decide. Allocates the partial outputs the split
// kernel writes when there is more than one split; keep the returned tensors until the launch.
std::vector<at::Tensor> choose_splits(FwdParams& params, Problem const& p, at::Tensor const& lse, int64_t requested);
// The warp-specialized Hopper forward's tile counter (FwdParams::tile_counter) and, for bf16 caps
// that take the listing and redo passes, the call's list (FwdParams::redo_tiles), where that
// kernel may run (after choose_splits, which decides the split-KV calls); the tensors must live
// until the launch.
std::vector<at::Tensor> ws_scratch(FwdParams& params, Problem const& p, at::Tensor const& q);

// Decoding one query row with GQA: the query heads that share a KV head become the rows of one
// problem (FA2's seqlenq_ngroups_swapped), so each K / V block is read once per KV head. q and out
// (batch, 1, heads, dim) are viewed as (batch, heads / heads_k, heads_k, dim) and softmax_lse is
// written as (batch, heads_k, heads / heads_k), the same memory as (batch, heads, 1). Returns
// whether the problem was packed (p, q, out updated; causal no longer matters for one row). Rows
// of different heads share one position, so a window or ALiBi rules packing out.
bool pack_gqa_rows(Problem& p, at::Tensor& q, at::Tensor& out, ScoreMods const& mods);

}  // namespace flash_attn_cute
