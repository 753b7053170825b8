// What the torch glue (or any C++ caller) sees of the backward. No CuTe, no torch.
#pragma once

#include <cuda_runtime.h>

#include "params.h"
#include "tile_size.h"

namespace flash_attn_cute {

// Floats per row of the backward's fp32 dQ accumulator (BwdParams::dq_accum_ptr): the kernel head
// dim, so that a query row block's tile is kBlockM * kernel head dim contiguous floats.
constexpr int dq_accum_row_floats(int kernel_head_dim) { return kernel_head_dim; }

// A dQ tile is added in fragment order (bwd_epilogue.h DqAccumulator): the float offset, in its row
// block's tile of the accumulator, of group `group` (values vec group .. vec group + vec - 1) of
// thread `thread`'s dQ fragment in a CTA of `threads` threads. The 32 lanes of a warp add one group
// index to 32 vec contiguous floats. vec: 2 (pairs), or 4 where the Hopper backward adds its tiles
// with atomics (head dim 256: one 16-byte reduction a group, half the instructions).
constexpr int dq_fragment_offset(int group, int thread, int threads, int vec = 2) {
  return vec * (group * threads + thread);
}

// Whether the deterministic backward takes the rotated dQ order (BwdParams::dq_rotate): no window
// (causal is the window (left, 0)), and the key blocks of a head (n_blocks, at the longest seqlen_k) few enough to be
// resident together with room to spare, on half the SMs (other kernels may hold some), as the
// rotated order's waits run across all key blocks of a head and the grid launches a head's key
// blocks one after the other. (SMs held for long by other streams, or an MPS / green-context SM
// limit that the SM count does not show, would stall it until they are freed.)
constexpr bool bwd_dq_rotate(bool deterministic, Window window, int64_t n_blocks, int num_sms) {
  return deterministic && window.left < 0 && window.right < 0 && n_blocks <= num_sms / 2;
}

// The grid's order in both backwards. Deterministic, key-block-major, (KV heads, batch, key
// blocks): the CTAs of key block n - 1, whose dQ tiles come first, launch before those of n. (In L2
// sections instead, the SM80 backward lost 12-17 % at causal hdim 256 from 2k tokens: a section's
// few pairs wait on each other's dQ turns.) Where the rotated order runs (BwdParams::dq_rotate)
// non-causal, and otherwise, a 1-D grid in bwd_cta_tile's order: the CTAs of one head run together
// and share Q and dO in L2; causal, in sections of pairs, the heaviest key blocks first.
constexpr bool bwd_grid_key_block_major(bool is_causal, bool deterministic, bool dq_rotate) {
  return deterministic && (is_causal || !dq_rotate);
}

// Whether a deterministic backward on compute capability 9.0 takes the Hopper kernel (its
// deterministic kernels, bwd_kernel_sm90.h, where built): the plain variant up to head dim 128,
// where it measured faster than the SM80 backward (session 58, H100: 1.2-1.4x, short causal calls
// 1.0x). Score mods, dropout and head dims 192 and 256 keep the SM80 kernel.
constexpr bool bwd_sm90_deterministic(int kernel_head_dim, Variant variant) {
  return variant == Variant::kPlain && kernel_head_dim <= 128;
}

// The deterministic dQ order's counters (BwdParams::dq_semaphore) are allocated for query row
// blocks of this many rows, the fewest of any backward kernel's (bwd_tile_shape, bwd_sm90_block_m),
// so that each kernel's row blocks find one.
constexpr int kDqSemaphoreRowBlock = 64;

// Defined in the generated instantiation files (csrc/generated/), one per combination.
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_bwd(BwdParams const& params, cudaStream_t stream);

// The same on the small tiles of GPUs with less shared memory a block than the default tiles take
// (BwdParams::small_smem), built where the build targets such GPUs (csrc/features.py).
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_bwd_small(BwdParams const& params, cudaStream_t stream);

// The Hopper backward (bwd_kernel_sm90.h): every variant, every kernel head dim (32 to 256).
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_bwd_sm90(BwdParams const& params, cudaStream_t stream);

// Runs the backward on params.dtype / params.head_dim / params.is_causal. Returns
// cudaErrorNotSupported when that combination was left out of this build.
cudaError_t run_bwd_dispatch(BwdParams const& params, cudaStream_t stream);

// Whether this build holds a backward kernel for the dtype, (kernel) head dim and variant.
bool bwd_is_built(DType dtype, int kernel_head_dim, Variant variant);

}  // namespace flash_attn_cute
