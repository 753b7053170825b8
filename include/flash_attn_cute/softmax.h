// Online softmax over the key blocks of one query row block, FA2 style: scores are exponentiated in
// base 2 with scale * log2(e) folded in, O is never normalised inside the loop, the row sums are
// kept per thread and reduced across the quad only once, in finalize().
#pragma once

#include <cstdint>
#include <cstring>

#include <cute/tensor.hpp>

#include "bounded_scores.h"
#include "mask.h"
#include "utils.h"

namespace flash_attn_cute {

using namespace cute;

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// How far (log2 units) a tile's row max may exceed the exponent's offset before the warp rescales.
inline constexpr float kRescaleLog2 = 8.f;

// x's bits as a To, on the host and the device (To and From of one size).
template <class To, class From>
FLASH_HOST_DEVICE To bit_cast(From x) {
  static_assert(sizeof(To) == sizeof(From));
  To y;
  std::memcpy(&y, &x, sizeof(y));
  return y;
}

// 2^x in FP32 arithmetic (FMA and integer pipes) instead of the MUFU unit's exp2, for kernels whose
// softmax waits on MUFU (the Hopper forward with softcap: tanh + exp2 per score). For x up to 127:
// x = n + f with n = round(x) and |f| <= 1/2, 2^f from a degree-3 minimax polynomial (relative
// error 7.5e-5, below the rounding of P to bf16 or fp16), n added to its exponent bits. x below
// -125 gives 2^-125 (the least n whose result stays a normal float), never 0: only for scores that
// cannot be -inf (mask-free steps).
FLASH_HOST_DEVICE float exp2_fma(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: the sum's low mantissa bits hold round(x)
  x = fmaxf(x, -125.f);
  const float shifted = x + kRound;
  const float f = x - (shifted - kRound);
  const float p = fmaf(fmaf(fmaf(0.05517145f, f, 0.24261060f), f, 0.69326097f), f, 0.99992812f);
  return bit_cast<float>(bit_cast<uint32_t>(p) + (bit_cast<uint32_t>(shifted) << 23));
}

// kLazyRescale: after the first tile, rescale O only when a row's max outgrows its offset by more
// than kRescaleLog2 (softmax_rescale_o); else at every tile, to the exact running max.
//
// kPairwiseMax: a thread's row max as a tree of fmaxf (a short dependency chain), for scores that
// are all there at once (straight from the MMA); else in column order, which follows scores that
// come out one by one (softcap's tanh).
template <int kNRows, bool kLazyRescale, bool kPairwiseMax = false>
struct Softmax {
  using RowTensor = decltype(make_tensor<float>(Shape<Int<kNRows>>{}));
  RowTensor row_max;  // the exponent's offset: the running max of the raw scores, quad-reduced, or at
                      // most kRescaleLog2 / scale_log2 below it (softmax_rescale_o)
  RowTensor row_sum;  // running sum of exp2 terms, this thread's columns only

  __device__ __forceinline__ Softmax() {
    fill(row_max, -INFINITY);
    fill(row_sum, 0.f);
  }

  // Bounded scores (BoundedScores): the exponent's offsets fixed for a whole tile. row_bias(mi): the
  // largest bias on row mi's scores (ALiBi's b_max), 0 without one.
  template <class RowBias>
  static __device__ __forceinline__ RowTensor fixed_offsets(float scale_log2, RowBias&& row_bias) {
    const float offset = BoundedScores::offset_log2(scale_log2) / scale_log2;
    RowTensor offsets;
#pragma unroll
    for (int mi = 0; mi < kNRows; ++mi) offsets(mi) = offset + row_bias(mi);
    return offsets;
  }

  // The fixed offsets before the first step: the steps then take kFixedOffset, which takes no max
  // and never rescales O.
  template <class RowBias>
  __device__ __forceinline__ void fix_offset(float scale_log2, RowBias&& row_bias) {
    const RowTensor offsets = fixed_offsets(scale_log2, row_bias);
#pragma unroll
    for (int mi = 0; mi < kNRows; ++mi) row_max(mi) = offsets(mi);
  }

  // For a cap too large for BoundedScores::fits, on the running max: whether each of this thread's
  // rows has a term of 2^kLeastLog2 or more under the fixed offsets (its offset, at most its max,
  // that far above them), so that they hold for the rest of the walk: later blocks only add terms.
  // Not a row that has seen no key.
  __device__ __forceinline__ bool offsets_reach(RowTensor const& fixed, float scale_log2) const {
    bool reach = true;
#pragma unroll
    for (int mi = 0; mi < kNRows; ++mi) {
      reach &= row_max(mi) * scale_log2 - fixed(mi) * scale_log2 >= BoundedScores::kLeastLog2;
    }
    return reach;
  }

  // On fixed offsets past BoundedScores::fits, at the end of the walk: whether each of this thread's
  // rows has a term of 2^kLeastLog2 or more, shown by a sum of at least that times the row's key
  // count, keys(mi) (0 for a row that sees none).
  template <class KeyCount>
  __device__ __forceinline__ bool sums_reach(KeyCount&& keys) const {
    bool reach = true;
#pragma unroll
    for (int mi = 0; mi < kNRows; ++mi) {
      const float sum = quad_allreduce(row_sum(mi), SumOp{});
      reach &= sum >= BoundedScores::kLeastTerm * float(keys(mi));
    }
    return reach;
  }

  // The max used as the exponent's offset. A row whose scores are all -inf so far (fully masked)
  // would give -inf - (-inf) = NaN; with Check_inf such a row uses 0 and its terms stay exp2(-inf) = 0.
  template <bool Check_inf>
  __device__ __forceinline__ float scaled_max(int mi, float scale_log2) const {
    return (Check_inf && row_max(mi) == -INFINITY) ? 0.f : row_max(mi) * scale_log2;
  }

  // Folds one tile of scores into the running state and rescales the O accumulator.
  // tSrS_rc: (rows, cols) view of the scores, overwritten with P = exp2(S * scale_log2 - max).
  // tOrO_rc: (rows, head_dim cols) view of the O accumulator.
  //
  // kLazyRescale: after the first tile, row_max is the exponent's offset rather than the exact
  // running max: it moves (and O and the sums are rescaled) only when some row of the warp's tile
  // exceeds its offset by more than kRescaleLog2, a branch the whole warp takes or skips. Otherwise P
  // is at most 2^kRescaleLog2, well inside fp16's range, and the warp skips a multiply per O element;
  // finalize gives the same O and LSE either way.
  //
  // kFmaExp2Every > 0: in a step without -inf scores (!Check_inf), every kFmaExp2Every-th column's
  // exponential is exp2_fma's rather than MUFU's.
  template <bool Is_first, bool Check_inf, int kFmaExp2Every = 0, class TensorS, class TensorO>
  __device__ __forceinline__ void softmax_rescale_o(TensorS& tSrS_rc, TensorO& tOrO_rc, float scale_log2) {
    move_offsets<Is_first, Check_inf>(tSrS_rc, scale_log2,
                                      [&](int mi, float factor) { rescale_row(tOrO_rc, mi, factor); });
    exponentiate<Check_inf, kFmaExp2Every>(tSrS_rc, scale_log2);
  }

  // softmax_rescale_o for a step function's run-time is_first (the first key block's step), or
  // with kFixedOffset (fix_offset) the exponentials alone.
  template <bool Check_inf, int kFmaExp2Every = 0, bool kFixedOffset = false, class TensorS, class TensorO>
  __device__ __forceinline__ void rescale_o(bool is_first, TensorS& tSrS_rc, TensorO& tOrO_rc, float scale_log2) {
    if constexpr (kFixedOffset) {
      exponentiate<Check_inf, kFmaExp2Every>(tSrS_rc, scale_log2);
    } else if (is_first) {
      softmax_rescale_o<true, Check_inf, kFmaExp2Every>(tSrS_rc, tOrO_rc, scale_log2);
    } else {
      softmax_rescale_o<false, Check_inf, kFmaExp2Every>(tSrS_rc, tOrO_rc, scale_log2);
    }
  }

  // softmax_rescale_o in two halves, for a caller whose MMAs still add into O during the
  // exponentials (the warp-specialized Hopper forward's P V of the previous key block): step_exp
  // folds the tile in and returns O's rescale, which rescale_by applies once O is ready.
  struct Rescale {
    RowTensor factor;
    bool needed;  // false: the offsets did not move (the first tile, or a lazy step within kRescaleLog2)
  };
  template <bool Check_inf, int kFmaExp2Every = 0, bool kFixedOffset = false, class TensorS>
  __device__ __forceinline__ Rescale step_exp(bool is_first, TensorS& tSrS_rc, float scale_log2) {
    Rescale rescale;
    if constexpr (kFixedOffset) {
      rescale.needed = false;
    } else {
      rescale = step_offsets<Check_inf>(is_first, tSrS_rc, scale_log2);
    }
    exponentiate<Check_inf, kFmaExp2Every>(tSrS_rc, scale_log2);
    return rescale;
  }

  // step_exp's offsets alone (on the running max), for a caller that may move them again.
  template <bool Check_inf, class TensorS>
  __device__ __forceinline__ Rescale step_offsets(bool is_first, TensorS const& tSrS_rc, float scale_log2) {
    Rescale rescale;
    auto keep_factor = [&](int mi, float factor) { rescale.factor(mi) = factor; };
    rescale.needed = is_first ? move_offsets<true, Check_inf>(tSrS_rc, scale_log2, keep_factor)
                              : move_offsets<false, Check_inf>(tSrS_rc, scale_log2, keep_factor);
    return rescale;
  }

  // Moves the offsets to the fixed ones (offsets_reach), rescaling the sums here and adding O's
  // factors to rescale (the step's, from step_offsets).
  __device__ __forceinline__ void move_to_fixed(RowTensor const& fixed, float scale_log2, Rescale& rescale) {
#pragma unroll
    for (int mi = 0; mi < kNRows; ++mi) {
      const float factor = exp2f(row_max(mi) * scale_log2 - fixed(mi) * scale_log2);
      row_max(mi) = fixed(mi);
      row_sum(mi) *= factor;
      rescale.factor(mi) = rescale.needed ? rescale.factor(mi) * factor : factor;
    }
    rescale.needed = true;
  }

  template <class TensorO>
  static __device__ __forceinline__ void rescale_by(Rescale const& rescale, TensorO& tOrO_rc) {
    if (!rescale.needed) return;
#pragma unroll
    for (int mi = 0; mi < kNRows; ++mi) rescale_row(tOrO_rc, mi, rescale.factor(mi));
  }

  // Row mi of O's accumulator times factor.
  template <class TensorO>
  static __device__ __forceinline__ void rescale_row(TensorO& tOrO_rc, int mi, float factor) {
#pragma unroll
    for (int di = 0; di < size<1>(tOrO_rc); ++di) tOrO_rc(mi, di) *= factor;
  }

  // The exponents' offsets for a new tile of scores: the tile's row max on the first tile; later
  // the running max, where it moves (every tile, or as kLazyRescale allows). Returns whether they
  // moved; each moved row's sum is rescaled here, and rescale_row(mi, factor) does its O (the
  // caller's).
  template <bool Is_first, bool Check_inf, class TensorS, class RescaleRow>
  __device__ __forceinline__ bool move_offsets(TensorS const& tSrS_rc, float scale_log2, RescaleRow&& rescale_row) {
    static_assert(decltype(size<0>(tSrS_rc))::value == kNRows);
    if constexpr (Is_first) {
#pragma unroll
      for (int mi = 0; mi < kNRows; ++mi) row_max(mi) = tile_row_max(tSrS_rc, mi);
      return false;
    } else {
      if (kLazyRescale && !any_row_outgrows_offset(tSrS_rc, scale_log2)) return false;
#pragma unroll
      for (int mi = 0; mi < kNRows; ++mi) {
        const float prev_max = row_max(mi);
        row_max(mi) = fmaxf(prev_max, tile_row_max(tSrS_rc, mi));
        // prev_max == -inf (nothing seen yet) gives exp2(-inf) = 0: acc and sum are 0 anyway.
        const float factor = exp2f(prev_max * scale_log2 - scaled_max<Check_inf>(mi, scale_log2));
        row_sum(mi) *= factor;
        rescale_row(mi, factor);
      }
      return true;
    }
  }

  // P = exp2(S * scale_log2 - offset) in place, added into the row sums.
  template <bool Check_inf, int kFmaExp2Every, class TensorS>
  __device__ __forceinline__ void exponentiate(TensorS& tSrS_rc, float scale_log2) {
    exponentiate_on<Check_inf, kFmaExp2Every>(tSrS_rc, scale_log2,
                                              [&](int mi) { return scaled_max<Check_inf>(mi, scale_log2); });
  }

  // exponentiate on the fixed offsets for scores that lack shift(mi) of their value, a constant a
  // row (alibi_side_shift): P = exp2((S + shift) * scale_log2 - offset), with the offsets moved
  // down by the shift for this tile alone.
  template <int kFmaExp2Every, class TensorS>
  __device__ __forceinline__ void exponentiate_shifted(TensorS& tSrS_rc, float scale_log2, RowTensor const& shift) {
    exponentiate_on<false, kFmaExp2Every>(tSrS_rc, scale_log2,
                                          [&](int mi) { return (row_max(mi) - shift(mi)) * scale_log2; });
  }

  // exponentiate with the offsets max_scaled(mi) (in the exponent's units).
  template <bool Check_inf, int kFmaExp2Every, class TensorS, class MaxScaled>
  __device__ __forceinline__ void exponentiate_on(TensorS& tSrS_rc, float scale_log2, MaxScaled&& max_scaled_of) {
#pragma unroll
    for (int mi = 0; mi < kNRows; ++mi) {
      const float max_scaled = max_scaled_of(mi);
      float sum = 0.f;
#pragma unroll
      for (int ni = 0; ni < size<1>(tSrS_rc); ++ni) {
        if (!Check_inf && kFmaExp2Every > 0 && ni % (kFmaExp2Every > 0 ? kFmaExp2Every : 1) == kFmaExp2Every - 1) {
          tSrS_rc(mi, ni) = exp2_fma(tSrS_rc(mi, ni) * scale_log2 - max_scaled);
        } else {
          tSrS_rc(mi, ni) = exp2f(tSrS_rc(mi, ni) * scale_log2 - max_scaled);
        }
        sum += tSrS_rc(mi, ni);
      }
      row_sum(mi) += sum;
    }
  }

  // Whether some row of the warp's tile exceeds its offset by more than kRescaleLog2 (false for
  // -inf tiles); the caller takes the tile's max again if so, rather than keep it in registers.
  // Each thread compares its own columns: the warp's vote covers the quads' other threads, so the
  // row's max over its quad (two shuffles) is not needed for the answer.
  template <class TensorS>
  __device__ __forceinline__ bool any_row_outgrows_offset(TensorS const& tSrS_rc, float scale_log2) const {
    bool grows = false;
#pragma unroll
    for (int mi = 0; mi < kNRows; ++mi) {
      grows |= thread_row_max(tSrS_rc, mi) * scale_log2 > row_max(mi) * scale_log2 + kRescaleLog2;
    }
    return __any_sync(0xffffffffu, grows);
  }

  // The max of this thread's columns of row mi (kPairwiseMax: pairwise).
  template <class TensorS>
  static __device__ __forceinline__ float thread_row_max(TensorS const& tSrS_rc, int mi) {
    constexpr int kCols = decltype(size<1>(tSrS_rc))::value;
    if constexpr (kPairwiseMax) {
      float m[kCols];
#pragma unroll
      for (int ni = 0; ni < kCols; ++ni) m[ni] = tSrS_rc(mi, ni);
#pragma unroll
      for (int stride = 1; stride < kCols; stride *= 2) {
#pragma unroll
        for (int ni = 0; ni + stride < kCols; ni += 2 * stride) m[ni] = fmaxf(m[ni], m[ni + stride]);
      }
      return m[0];
    } else {
      float m = -INFINITY;
#pragma unroll
      for (int ni = 0; ni < kCols; ++ni) m = fmaxf(m, tSrS_rc(mi, ni));
      return m;
    }
  }

  // The max of row mi of a score tile, over the quad of threads that hold the row.
  template <class TensorS>
  static __device__ __forceinline__ float tile_row_max(TensorS const& tSrS_rc, int mi) {
    return quad_allreduce(thread_row_max(tSrS_rc, mi), MaxOp{});
  }

  // Normalises O by the row sums (times o_scale: dropout's 1 / (1 - p)) and returns each row's
  // natural-log LSE. Rows that saw no visible key (sum 0) keep O = 0 and get LSE = +inf,
  // flash-attn's convention.
  template <class TensorO>
  __device__ __forceinline__ RowTensor finalize(TensorO& tOrO_rc, float softmax_scale, float o_scale = 1.f) {
    RowTensor lse;
#pragma unroll
    for (int mi = 0; mi < kNRows; ++mi) {
      const float sum = quad_allreduce(row_sum(mi), SumOp{});
      const bool empty = sum == 0.f || sum != sum;
      const float inv_sum = empty ? 1.f : o_scale / sum;
      lse(mi) = empty ? INFINITY : row_max(mi) * softmax_scale + __logf(sum);
#pragma unroll
      for (int di = 0; di < size<1>(tOrO_rc); ++di) tOrO_rc(mi, di) *= inv_sum;
    }
    return lse;
  }
};

// The backward's softmax: P recomputed from the forward's LSE, and dS = P * (dP - D).
// tSrS_rc: (rows, cols) scores, overwritten with P = exp2(S * scale_log2 - lse_log2(row)); a row
// with lse_log2 = +inf (no key seen, or past seqlen_q) gets P = 0.
template <class TensorS, class TensorRow>
__device__ __forceinline__ void probs_from_lse(TensorS& tSrS_rc, TensorRow const& lse_log2, float scale_log2) {
#pragma unroll
  for (int mi = 0; mi < size<0>(tSrS_rc); ++mi) {
#pragma unroll
    for (int ni = 0; ni < size<1>(tSrS_rc); ++ni) {
      tSrS_rc(mi, ni) = exp2f(tSrS_rc(mi, ni) * scale_log2 - lse_log2(mi));
    }
  }
}

// tdPrdP_rc: (rows, cols) dP = dO V^T, overwritten with dS = P * (dP - D(row)). Is_dropout: P is
// negative where dropout dropped it (negate_dropped), and dS = max(P, 0) dP - |P| D, which is
// P * (keep * dP - D).
template <bool Is_dropout, class TensordP, class TensorP, class TensorRow>
__device__ __forceinline__ void dscores(TensordP& tdPrdP_rc, TensorP const& tSrP_rc, TensorRow const& dsum) {
#pragma unroll
  for (int mi = 0; mi < size<0>(tdPrdP_rc); ++mi) {
#pragma unroll
    for (int ni = 0; ni < size<1>(tdPrdP_rc); ++ni) {
      const float p = tSrP_rc(mi, ni), dp = tdPrdP_rc(mi, ni);
      tdPrdP_rc(mi, ni) = Is_dropout ? fmaxf(p, 0.f) * dp - fabsf(p) * dsum(mi) : p * (dp - dsum(mi));
    }
  }
}

// Softcap's backward: the scores went through tanh, so dS *= 1 - t^2 where t is recovered from P =
// exp2((t + slope_scaled * alibi_bias) * scale_log2 - lse_log2), i.e. with the ALiBi bias (added
// after the tanh; slope_scaled 0 without ALiBi) taken back out. Where P is 0, dS is already 0 and
// stays so. Is_dropout: P is negative where dropout dropped it (negate_dropped). tScS: the (row,
// col) of each score (the accumulator's shape) in the tile whose first row / key are row0 / col0.
template <bool Is_dropout, class TensordS, class TensorP, class TensorRow, class TensorC>
__device__ __forceinline__ void softcap_dscores(TensordS& tdSrdS_rc, TensorP const& tSrP_rc, TensorRow const& lse_log2,
                                                float scale_log2, TensorC const& tScS, int row0, int col0,
                                                int seqlen_q, int seqlen_k, bool causal_form, float slope_scaled) {
  const float inv_scale_log2 = 1.f / scale_log2;
  auto dscore = [&](int mi, int ni, float bias) {
    const float p = Is_dropout ? fabsf(tSrP_rc(mi, ni)) : tSrP_rc(mi, ni);
    const float t = (__log2f(p) + lse_log2(mi)) * inv_scale_log2 - bias;
    tdSrdS_rc(mi, ni) = p > 0.f ? tdSrdS_rc(mi, ni) * (1.f - t * t) : 0.f;
  };
  for_each_alibi_bias(tScS, row0, col0, seqlen_q, seqlen_k, causal_form, slope_scaled, dscore);
}

}  // namespace flash_attn_cute
