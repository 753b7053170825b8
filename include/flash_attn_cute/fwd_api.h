// What the torch glue (or any C++ caller) sees of the forward: the params, the launcher
// declarations and which instantiations this build has. No CuTe, no torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "params.h"
#include "tile_size.h"

namespace flash_attn_cute {

// Defined in the generated instantiation files (csrc/generated/), one per combination.
// kIsEvenK: params.head_dim == kHeadDim (no column predicates); kVariant: params.variant().
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_fwd(FwdParams const& params, cudaStream_t stream);

// The same on the small tiles of GPUs with less shared memory a block (fwd_small_smem: head dim 256
// full and dropout on sm_86 / sm_89), whole launches; built where the build targets such GPUs
// (csrc/features.py).
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_fwd_small(FwdParams const& params, cudaStream_t stream);

// Whether this build's small-tile kernels (forward and backward) run on compute capability
// cc_major.x: on 9.x only when built for every arch (csrc/features.py).
bool small_smem_runs_on(int cc_major);

// The Hopper forward (fwd_kernel_sm90.h, sm_90a): every variant, whole (not split-KV) launches.
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_fwd_sm90(FwdParams const& params, cudaStream_t stream);

// Whether TMA (fwd_ws_tma.h) can load these views of 16-bit elements: 16-byte aligned bases and
// strides, the strides below 2^40 bytes.
inline bool tma_views_fit(std::initializer_list<TensorView const*> views) {
  for (const TensorView* v : views) {
    if (reinterpret_cast<uintptr_t>(v->ptr) % 16 != 0) return false;
    for (index_t stride : {v->row_stride, v->head_stride, v->batch_stride}) {
      if (stride <= 0 || stride * 2 % 16 != 0 || stride * 2 >= (index_t(1) << 40)) return false;
    }
  }
  return true;
}

// A view as the TMA descriptors take it. Varlen views have no batch stride (0), which the driver
// refuses: their one batch entry (the packed rows) gets the tensor's extent as its stride, never
// stepped over.
inline TensorView tma_packed_view(TensorView view, bool packed, index_t total_rows) {
  if (packed) view.batch_stride = total_rows * view.row_stride;
  return view;
}
inline TensorView tma_view_q(TensorView const& view, FwdParams const& p) {
  return tma_packed_view(view, p.cu_seqlens_q != nullptr, p.total_q);
}
inline TensorView tma_view_k(TensorView const& view, FwdParams const& p) {
  return tma_packed_view(view, p.cu_seqlens_k != nullptr, p.total_k);
}
// Whether a TMA coordinate reaches every row: packed rows, at least one (no descriptor for an empty
// tensor), fewer than 2^31.
inline bool tma_rows_fit(bool packed, index_t total_rows) { return !packed || (total_rows > 0 && total_rows <= INT32_MAX); }

// Whether the warp-specialized kernel's TMA loads fit (fwd_ws_tma.h): each sequence's rows at a row
// offset into its batch entry (varlen's packed rows, seqused_k's first keys; no leftpad,
// kv_batch_idx or page table), views TMA can load.
inline bool fwd_ws_tma_fits(FwdParams const& p) {
  if (p.leftpad_k || p.kv_batch_idx || p.block_table) return false;
  if (!tma_rows_fit(p.cu_seqlens_q, p.total_q) || !tma_rows_fit(p.cu_seqlens_k, p.total_k)) return false;
  const TensorView q = tma_view_q(p.q, p), k = tma_view_k(p.k, p), v = tma_view_k(p.v, p);
  return tma_views_fit({&q, &k, &v});
}

// The window of a launch's rows as its kernel reads it: the plain kernels take theirs from
// params.is_causal (the kernel's causal flag), causal with a left window or full.
inline Window fwd_kernel_window(FwdParams const& params, Variant variant) {
  if (variant != Variant::kPlain) return params.window;
  return params.is_causal ? Window{params.window.left, 0} : Window{-1, -1};
}

// Whether a Hopper forward launch of that kernel head dim and variant takes the warp-specialized
// kernel (fwd_kernel_sm90_ws.h): FLASH_ATTN_CUTE_SM90_WS (params.sm90_ws) or, by default, where
// fwd_sm90_ws_pays says so for the rows within the window as the kernel reads it (fwd_kernel_window).
inline bool fwd_sm90_takes_ws(FwdParams const& params, int kernel_head_dim, Variant variant) {
  if (!fwd_sm90_warp_specialized(kernel_head_dim) || params.sm90_ws == 0) return false;
  if (params.sm90_ws == 1) return true;
  const bool score_mods = variant != Variant::kPlain;
  const Window window = fwd_kernel_window(params, variant);
  return fwd_sm90_ws_pays(kernel_head_dim, params.seqlen_q, params.seqlen_k, window.left, window.right,
                          score_mods && params.softcap > 0.f, score_mods, fwd_ws_tma_fits(params));
}

// Whether a warp-specialized launch of that kernel head dim and variant takes its three-consumer
// kernel where it has one (tile_size.h): FLASH_ATTN_CUTE_SM90_WS_CONSUMERS (params.sm90_ws_consumers)
// or, by default, where fwd_sm90_ws_three_consumers_pay says so.
inline bool fwd_sm90_ws_takes_three_consumers(FwdParams const& params, int kernel_head_dim, Variant variant) {
  if (!fwd_sm90_ws_has_three_consumers(kernel_head_dim) || params.sm90_ws_consumers == 2) return false;
  if (params.sm90_ws_consumers == 3) return true;
  const Window window = fwd_kernel_window(params, variant);
  return fwd_sm90_ws_three_consumers_pay(kernel_head_dim, params.seqlen_q, params.seqlen_k, window.left, window.right);
}

// Runs the forward on params.dtype / params.head_dim / params.is_causal. Returns
// cudaErrorNotSupported when that combination was left out of this build.
cudaError_t run_fwd_dispatch(FwdParams const& params, cudaStream_t stream);

// Whether this build holds a kernel for the dtype, (kernel) head dim and variant.
bool fwd_is_built(DType dtype, int kernel_head_dim, Variant variant);

}  // namespace flash_attn_cute
