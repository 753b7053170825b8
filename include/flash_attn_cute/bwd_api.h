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
// block's tile of the accumulator, of pair `pair` (values 2 pair and 2 pair + 1) of thread
// `thread`'s dQ fragment in a CTA of `threads` threads. The 32 lanes of a warp add one pair index
// to 256 contiguous bytes.
constexpr int dq_fragment_offset(int pair, int thread, int threads) { return 2 * (pair * threads + thread); }

// Defined in the generated instantiation files (csrc/generated/), one per combination.
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_bwd(BwdParams const& params, cudaStream_t stream);

// Runs the backward on params.dtype / params.head_dim / params.is_causal. Returns
// cudaErrorNotSupported when that combination was left out of this build.
cudaError_t run_bwd_dispatch(BwdParams const& params, cudaStream_t stream);

// Whether this build holds a backward kernel for the dtype, (kernel) head dim and variant.
bool bwd_is_built(DType dtype, int kernel_head_dim, Variant variant);

}  // namespace flash_attn_cute
