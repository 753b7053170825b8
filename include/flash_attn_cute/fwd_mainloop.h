// The forward's walk over the key blocks, shared by the SM80 kernel (fwd_kernel.h) and the Hopper
// ones (fwd_kernel_sm90.h, fwd_kernel_sm90_ws.h): which steps run masked, and one loop per softcap
// (and, on Hopper, ALiBi) case.
#pragma once

#include <cute/tensor.hpp>

#include "block_info.h"
#include "mask.h"
#include "softmax.h"

namespace flash_attn_cute {

// The score transforms that follow Q K^T in a forward step on the tile whose first row / key are
// row0 / col0: with softcap, its tanh and then (kAlibi) the ALiBi bias (without softcap the bias was
// S's initial value), in the causal form from column alibi_col_ref where alibi_causal says (the
// caller shifts the LSE); then, in a masked step, the mask.
template <bool kSoftcap, bool kMasked, bool kAlibi, class TensorS, class TensorC>
__device__ __forceinline__ void fwd_score_mods(TensorS& tSrS, TensorC const& tScS, int row0, int col0,
                                               FwdMask const& mask, float softcap, float alibi_slope,
                                               bool alibi_causal = false, int alibi_col_ref = 0) {
  if constexpr (kSoftcap) {
    apply_softcap(tSrS, softcap);
    if constexpr (kAlibi) {
      apply_alibi(tSrS, tScS, row0, col0, mask.seqlen_q, mask.seqlen_k, alibi_causal, alibi_slope, alibi_col_ref);
    }
  }
  if constexpr (kMasked) mask.apply(tSrS, tScS, row0, col0);
}

// Calls step(n_block, is_masked, is_first, cases...) for range's key blocks in walk's order, from
// its step s0 on; is_masked and the cases (passed through: with_softcap, ...) are compile-time
// constants. The first step always runs masked (a no-op mask when its block is fully visible), so
// only the masked step carries the Is_first softmax variant: one copy fewer of the loop body. With
// kLead, so do the walk's lead steps (n_lead), in a loop of their own: tested in the main loop, ptxas
// computed n_lead again in every step.
template <bool kLead = false, class Step, class... Cases>
__device__ __forceinline__ void fwd_walk(NBlockRange const& range, KeyBlockWalk const& walk, int s0, Step&& step,
                                         Cases... cases) {
  int s = s0;
  if constexpr (kLead) {
    for (; s < walk.n_lead; ++s) step(walk.n_block(s), cute::true_type{}, s == 0, cases...);
  }
  for (; s < walk.steps(); ++s) {
    const int n_block = walk.n_block(s);
    if (s == 0 || range.is_masked(n_block)) {
      step(n_block, cute::true_type{}, s == 0, cases...);
    } else {
      step(n_block, cute::false_type{}, false, cases...);
    }
  }
}

// fwd_walk from the top down (fwd_key_block_walk(range)), for the SM80 kernel, whose loads run
// one block ahead of the walk: the same order in a plain loop, n_block counting down.
template <class Step, class... Cases>
__device__ __forceinline__ void fwd_walk_top_down(NBlockRange const& range, Step&& step, Cases... cases) {
  for (int n_block = range.n_block_max - 1; n_block >= range.n_block_min; --n_block) {
    const bool is_first = n_block == range.n_block_max - 1;
    if (is_first || range.is_masked(n_block)) {
      step(n_block, cute::true_type{}, is_first, cases...);
    } else {
      step(n_block, cute::false_type{}, false, cases...);
    }
  }
}

// fwd_walk_top_down with one loop per softcap case when the variant has the score mods (Has_mods):
// ptxas predicates a softcap checked in the step instead of branching over it, so every step would
// issue a tanh per score, softcap or not.
template <bool Has_mods, class Step>
__device__ __forceinline__ void fwd_mainloop(NBlockRange const& range, float softcap, Step&& step) {
  if constexpr (Has_mods) {
    if (softcap > 0.f) {
      fwd_walk_top_down(range, step, cute::true_type{});
    } else {
      fwd_walk_top_down(range, step, cute::false_type{});
    }
  } else {
    fwd_walk_top_down(range, step, cute::false_type{});
  }
}

// The Hopper forwards' softcap loop without ALiBi runs with a fixed offset (BoundedScores) where P
// is bf16 (softcap_fixed_offset); a cap too large for it takes the ALiBi loop, with a slope of 0
// where the head has none (sm90_alibi_loop: whether fwd_walk_sm90 takes that loop).
template <bool Is_softcap, class Element>
inline constexpr bool softcap_fixed_offset = Is_softcap && std::is_same_v<Element, cutlass::bfloat16_t>;

// Whether bf16 softcap's fixed offset applies: no ALiBi slope and a cap that fits.
FLASH_HOST_DEVICE bool fixed_offset_fits(bool has_alibi, float scale_log2) {
  return !has_alibi && BoundedScores::fits(scale_log2);
}

// The loops of fwd_walk_sm90 that a kernel holds: both, chosen per tile (alibi_loop), or one. The
// warp-specialized forward's bf16 softcap has a kernel for each of the last four
// (run_fwd_sm90_ws): for caps that fit (BoundedScores), the fixed offset without ALiBi and the
// fixed offset plus each row's largest ALiBi bias; for larger caps, the same two once each tile's
// first key blocks show that they hold (StepOffset::kChecked), the online softmax until then (in
// the ALiBi loop, a slope of 0 where a head has none). Caps up to 100 run the first two anyway,
// then the checked ones on the tiles where a row's sum shows that the offset may not hold
// (FwdParams::redo_tiles).
enum class Sm90Loops { kPerTile, kNoBias, kAlibiFixedOffset, kCheckedNoBias, kCheckedAlibi };

template <Sm90Loops kLoops>
inline constexpr bool sm90_alibi_loop_only =
    kLoops == Sm90Loops::kCheckedAlibi || kLoops == Sm90Loops::kAlibiFixedOffset;
template <Sm90Loops kLoops>
inline constexpr bool sm90_no_bias_loop_only = kLoops == Sm90Loops::kNoBias || kLoops == Sm90Loops::kCheckedNoBias;
template <Sm90Loops kLoops>
inline constexpr bool sm90_checks_offset = kLoops == Sm90Loops::kCheckedNoBias || kLoops == Sm90Loops::kCheckedAlibi;
// The fixed-offset kernels, which run the listing pass for larger caps (FwdParams::redo_tiles).
template <Sm90Loops kLoops>
inline constexpr bool sm90_lists_redo = kLoops == Sm90Loops::kNoBias || kLoops == Sm90Loops::kAlibiFixedOffset;

// A Hopper step's exponent offset (its last case, a cute::C): BoundedScores' fixed offset, the
// running max, or (kChecked, a checked kernel's first steps) the running max, then the fixed offset
// where the running max shows that it holds for the rest of the tile (Softmax::offsets_reach). The
// step returns whether it ends on the fixed offset.
enum class StepOffset { kOnline, kFixed, kChecked };

template <bool Is_softcap, class Element, Sm90Loops kLoops = Sm90Loops::kPerTile>
__device__ __forceinline__ bool sm90_alibi_loop(bool has_alibi, float scale_log2) {
  if constexpr (kLoops != Sm90Loops::kPerTile) return sm90_alibi_loop_only<kLoops>;
  return softcap_fixed_offset<Is_softcap, Element> ? !fixed_offset_fits(has_alibi, scale_log2) : has_alibi;
}

// Whether a softcap step (kSoftcap) of loop kAlibi always exponentiates with the fixed offset.
template <bool kSoftcap, class Element, Sm90Loops kLoops, bool kAlibi>
inline constexpr bool sm90_fixed_offset_step =
    softcap_fixed_offset<kSoftcap, Element> && !sm90_checks_offset<kLoops> &&
    (!kAlibi || kLoops == Sm90Loops::kAlibiFixedOffset);

// Whether a tile whose walk takes loop alibi_loop (sm90_alibi_loop) fixes softcap's offset before it
// (Softmax::fix_offset): exactly when that loop's softcap steps are sm90_fixed_offset_step's.
template <bool Is_softcap, class Element, Sm90Loops kLoops = Sm90Loops::kPerTile>
__device__ __forceinline__ bool sm90_fixes_offset(bool alibi_loop) {
  return alibi_loop ? sm90_fixed_offset_step<Is_softcap, Element, kLoops, true>
                    : sm90_fixed_offset_step<Is_softcap, Element, kLoops, false>;
}

// fwd_walk for the Hopper forwards, whose softcap case is a kernel's (Is_softcap): step(n_block,
// is_masked, is_first, with_softcap, with_alibi, offset) (offset: StepOffset). with_alibi
// (alibi_loop) where the head has an ALiBi slope, or where a bf16 cap is too large for softcap's
// fixed-offset loop, in a loop of its own. Decided in the step, the bias's branch would end ptxas's
// block between the tanh and the exponentials (which then no longer interleave), and without
// softcap leave the MMA's scale of S (the bias is its initial value) a run-time value: ptxas zeroes
// S before every Q K^T. A checked kernel checks on its first kCheckSteps steps (masked: rows may
// have no key yet): by then every row has seen its first keys (the tile's rows span that many key
// blocks), and a tile whose offsets still fail stays online.
template <bool Has_mods, bool Is_softcap, class Element, Sm90Loops kLoops = Sm90Loops::kPerTile,
          int kCheckSteps = 0, bool kLead = false, class Step>
__device__ __forceinline__ void fwd_walk_sm90(NBlockRange const& range, KeyBlockWalk const& walk, bool alibi_loop,
                                              Step&& step) {
  static_assert(Has_mods || kLoops == Sm90Loops::kPerTile);
  static_assert(!sm90_checks_offset<kLoops> || kCheckSteps > 0);
  using Softcap = cute::bool_constant<Is_softcap>;
  auto walk_loop = [&](auto with_alibi) __attribute__((always_inline)) {
    using Offset = StepOffset;
    if constexpr (sm90_checks_offset<kLoops>) {
      const int checks = walk.steps() < kCheckSteps ? walk.steps() : kCheckSteps;
      bool fixed = false;
      int s = 0;
      for (; s < checks && !fixed; ++s) {
        fixed = step(walk.n_block(s), cute::true_type{}, s == 0, Softcap{}, with_alibi, cute::C<Offset::kChecked>{});
      }
      if (fixed) {
        fwd_walk<kLead>(range, walk, s, step, Softcap{}, with_alibi, cute::C<Offset::kFixed>{});
      } else {
        fwd_walk<kLead>(range, walk, s, step, Softcap{}, with_alibi, cute::C<Offset::kOnline>{});
      }
    } else {
      constexpr bool kFixed = sm90_fixed_offset_step<Is_softcap, Element, kLoops, decltype(with_alibi)::value>;
      fwd_walk<kLead>(range, walk, 0, step, Softcap{}, with_alibi, cute::C<kFixed ? Offset::kFixed : Offset::kOnline>{});
    }
  };
  if constexpr (Has_mods && !sm90_no_bias_loop_only<kLoops>) {
    if (sm90_alibi_loop_only<kLoops> || alibi_loop) {
      walk_loop(cute::true_type{});
      return;
    }
  }
  if constexpr (!sm90_alibi_loop_only<kLoops>) walk_loop(cute::false_type{});
}

}  // namespace flash_attn_cute
