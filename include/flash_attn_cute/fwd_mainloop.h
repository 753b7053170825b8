// The forward's walk over the key blocks, shared by the SM80 kernel (fwd_kernel.h) and the Hopper
// one (fwd_kernel_sm90.h): which steps run masked, and one loop per softcap case.
#pragma once

#include <cute/tensor.hpp>

#include "block_info.h"
#include "mask.h"

namespace flash_attn_cute {

// The score transforms that follow Q K^T in a forward step on the tile whose first row / key are
// row0 / col0: with softcap, its tanh and then the ALiBi bias where the head has a slope (without
// softcap the bias was S's initial value); then, in a masked step, the mask.
template <bool kSoftcap, bool kMasked, class TensorS, class TensorC>
__device__ __forceinline__ void fwd_score_mods(TensorS& tSrS, TensorC const& tScS, int row0, int col0,
                                               FwdMask const& mask, float softcap, float alibi_slope) {
  if constexpr (kSoftcap) {
    apply_softcap(tSrS, softcap);
    if (alibi_slope != 0.f) apply_alibi(tSrS, tScS, row0, col0, mask.seqlen_q, mask.seqlen_k, false, alibi_slope);
  }
  if constexpr (kMasked) mask.apply(tSrS, tScS, row0, col0);
}

// Calls step(n_block, is_masked, is_first, with_softcap) for range's key blocks from the top down;
// is_masked and with_softcap (passed through) are cute::true_type / false_type. The first step
// always runs masked (a no-op mask when its block is fully visible), so only the masked step
// carries the Is_first softmax variant: one copy fewer of the loop body.
template <class WithSoftcap, class Step>
__device__ __forceinline__ void fwd_walk(NBlockRange const& range, WithSoftcap with_softcap, Step&& step) {
  for (int n_block = range.n_block_max - 1; n_block >= range.n_block_min; --n_block) {
    const bool is_first = n_block == range.n_block_max - 1;
    if (is_first || range.is_masked(n_block)) {
      step(n_block, cute::true_type{}, is_first, with_softcap);
    } else {
      step(n_block, cute::false_type{}, false, with_softcap);
    }
  }
}

// fwd_walk with one loop per softcap case when the variant has the score mods (Has_mods): ptxas
// predicates a softcap checked in the step instead of branching over it, so every step would issue
// a tanh per score, softcap or not.
template <bool Has_mods, class Step>
__device__ __forceinline__ void fwd_mainloop(NBlockRange const& range, float softcap, Step&& step) {
  if constexpr (Has_mods) {
    if (softcap > 0.f) {
      fwd_walk(range, cute::true_type{}, step);
    } else {
      fwd_walk(range, cute::false_type{}, step);
    }
  } else {
    fwd_walk(range, cute::false_type{}, step);
  }
}

}  // namespace flash_attn_cute
