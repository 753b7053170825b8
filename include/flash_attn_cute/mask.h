// The visibility rule (block_info.h's Window) and the score transforms applied to one tile of
// scores before the softmax: the mask, ALiBi and softcap.
#pragma once

#include <cute/tensor.hpp>

#include "block_info.h"
#if defined(__CUDACC__)
#include "utils.h"
#endif

namespace flash_attn_cute {

struct FwdMask {
  int seqlen_q;
  int seqlen_k;
  Window window;

  // The keys row sees, [begin, end) (begin < 0 where the window reaches past the first key).
  // Row and column are positions in the sequence, not in the tile.
  struct Cols {
    int begin, end;
  };
  FLASH_HOST_DEVICE constexpr Cols visible_cols(int row) const {
    const int diag_col = row + seqlen_k - seqlen_q;  // the row's causal diagonal
    return {window.left < 0 ? 0 : diag_col - window.left,
            window.right < 0 ? seqlen_k : min_int(seqlen_k, diag_col + window.right + 1)};
  }

  // How many keys row sees (visible_cols clipped to the sequence).
  FLASH_HOST_DEVICE constexpr int key_count(int row) const {
    const Cols cols = visible_cols(row);
    const int first = cols.begin < 0 ? 0 : cols.begin;
    return cols.end > first ? cols.end - first : 0;
  }

  // visible_cols' rule for one key. Written out: the backward's per-score loop with it through
  // visible_cols took fewer instructions but ran 3-4 % slower with score mods (session 33).
  FLASH_HOST_DEVICE constexpr bool key_visible(int row, int col) const {
    const int diag = seqlen_k - seqlen_q;
    return col < seqlen_k && (window.right < 0 || col <= row + diag + window.right) &&
           (window.left < 0 || col >= row + diag - window.left);
  }

  // The largest ALiBi bias (alibi_bias's symmetric form times slope_scaled) on a key that row sees,
  // 0 where it sees none. The bias falls linearly with the distance from the row's diagonal: its
  // largest value sits on the visible key nearest the diagonal for a slope >= 0, the farthest for
  // a negative one.
  FLASH_HOST_DEVICE constexpr float alibi_max_bias(int row, float slope_scaled) const {
    const Cols cols = visible_cols(row);
    const int diag_col = row + seqlen_k - seqlen_q;
    const int first = cols.begin < 0 ? 0 : cols.begin, last = cols.end - 1;
    if (last < first) return 0.f;
    const int near = diag_col < first ? first - diag_col : diag_col > last ? diag_col - last : 0;
    const int far = diag_col - first > last - diag_col ? diag_col - first : last - diag_col;
    return -slope_scaled * float(slope_scaled >= 0.f ? near : far);
  }

#if defined(__CUDACC__)
  // tSrS: scores of one (kBlockM, kBlockN) MMA accumulator tile; tScS: the (row, col) of each score
  // inside the tile, partitioned the same way. Invisible scores become -inf. Row by row: the row's
  // visible keys are one interval (visible_cols), so each score costs two compares.
  template <class TensorS, class TensorC>
  FLASH_HOST_DEVICE void apply(TensorS& tSrS, TensorC const& tScS, int row0, int col0) const {
    static_assert(decltype(cute::size(tSrS))::value == decltype(cute::size(tScS))::value);
    cute::Tensor s = cute::make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
    cute::Tensor c = cute::make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));  // (rows, cols) -> (m, n)
#pragma unroll
    for (int mi = 0; mi < cute::size<0>(s); ++mi) {
      const Cols cols = visible_cols(row0 + cute::get<0>(c(mi, 0)));
#pragma unroll
      for (int ni = 0; ni < cute::size<1>(s); ++ni) {
        const int col = col0 + cute::get<1>(c(0, ni));
        if (col >= cols.end || col < cols.begin) s(mi, ni) = -INFINITY;
      }
    }
  }
#endif
};

// ALiBi, flash-attn 2.x's kernel convention: the logit of (row i, key j) gets slope * alibi_bias,
//   -|i + seqlen_k - seqlen_q - j|, or, causal (no left window), +j: the same up to a constant per
// row (the output is the same; softmax_lse differs by it, and matches flash-attn's).
// Scores are in units of the softmax scale, so the kernels add slope / softmax_scale times it.
FLASH_HOST_DEVICE constexpr float alibi_bias(int row, int col, int seqlen_q, int seqlen_k, bool causal_form) {
  const int d = row + seqlen_k - seqlen_q - col;
  return causal_form ? float(col) : -float(d < 0 ? -d : d);
}

FLASH_HOST_DEVICE constexpr bool alibi_causal_form(Window window) { return window.left < 0 && window.right == 0; }

// On every key a causal row sees (col <= row + seqlen_k - seqlen_q), the causal form is the
// symmetric one plus this per-row constant: a kernel may add the symmetric form and shift the LSE.
FLASH_HOST_DEVICE constexpr int alibi_causal_shift(int row, int seqlen_q, int seqlen_k) {
  return row + seqlen_k - seqlen_q;
}

#if defined(__CUDACC__)
// Calls fn(mi, ni, slope_scaled * alibi_bias) over the (rows, cols) view of one accumulator tile
// whose scores sit at tScS's (row, col) in a tile starting at (row0, col0). A thread's columns are
// one base plus compile-time offsets, and its rows few: the positions go to float once per row or
// column (exact below 2^24), so each score costs one or two adds, not an int-to-float conversion.
// kOneSided: in the symmetric form, where a whole warp's scores lie on one side of the diagonal
// (every warp but those it crosses), |d| is d or -d throughout and the bias one FFMA a score (see
// below); fill_alibi's, which runs before Q K^T. After softcap's tanh (apply_alibi) the branch cost
// more than the FFMA saves (session 43, hdim 64: softcap + ALiBi 0.72 -> 0.62 of plain).
template <bool kOneSided = false, class TensorC, class Fn>
FLASH_HOST_DEVICE void for_each_alibi_bias(TensorC const& tScS, int row0, int col0, int seqlen_q, int seqlen_k,
                                           bool causal_form, float slope_scaled, Fn&& fn) {
  cute::Tensor c = cute::make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));  // (rows, cols) -> (m, n)
  const int col_first = col0 + cute::get<1>(c(0, 0));
  auto col_offset = [&](int ni) { return float(cute::get<1>(c(0, ni)) - cute::get<1>(c(0, 0))); };
  if (causal_form) {
    const float col_first_f = float(col_first);
#pragma unroll
    for (int ni = 0; ni < cute::size<1>(c); ++ni) {
      const float bias = slope_scaled * (col_first_f + col_offset(ni));
#pragma unroll
      for (int mi = 0; mi < cute::size<0>(c); ++mi) fn(mi, ni, bias);
    }
    return;
  }
  // The symmetric form: -slope_scaled * |d|, d = d_first(mi) - col_offset(ni).
  auto d_first = [&](int mi) { return row0 + cute::get<0>(c(mi, 0)) + seqlen_k - seqlen_q - col_first; };
  if constexpr (kOneSided) {
    // All d >= 0 (below the diagonal) or all <= 0: fma(side * slope_scaled, col_offset, -side *
    // slope_scaled * d_first), whose rounding of the product with d_first leaves it off the exact
    // bias by at most 2^-24 * slope_scaled * (|d| + |d_first|) more. Warp-uniform: a warp whose
    // rows the diagonal crosses runs the two-step form alone, not both.
    const int span = cute::get<1>(c(0, cute::size<1>(c) - 1)) - cute::get<1>(c(0, 0));
    bool below = true, above = true;
#pragma unroll
    for (int mi = 0; mi < cute::size<0>(c); ++mi) {
      below = below && d_first(mi) >= span;
      above = above && d_first(mi) <= 0;
    }
#if defined(__CUDA_ARCH__)
    below = __all_sync(__activemask(), below);
    above = __all_sync(__activemask(), above);
#endif
    if (below || above) {
      const float side_slope = below ? slope_scaled : -slope_scaled;
#pragma unroll
      for (int mi = 0; mi < cute::size<0>(c); ++mi) {
        const float base = -side_slope * float(d_first(mi));
#pragma unroll
        for (int ni = 0; ni < cute::size<1>(c); ++ni) fn(mi, ni, fmaf(side_slope, col_offset(ni), base));
      }
      return;
    }
  }
#pragma unroll
  for (int mi = 0; mi < cute::size<0>(c); ++mi) {
    const float d_first_f = float(d_first(mi));
#pragma unroll
    for (int ni = 0; ni < cute::size<1>(c); ++ni) fn(mi, ni, -slope_scaled * fabsf(d_first_f - col_offset(ni)));
  }
}

// ALiBi's bias at entry i of a thread's accumulator tile, whatever its layout (the SM90 backward's
// S^T = K Q^T holds keys along M), without an int-to-float conversion a score: tScS's coordinates
// are entry 0's plus compile-time offsets, so entry 0's key and diagonal offset (alibi_bias's d),
// converted to float once, plus constants give entry i's (exact below 2^24). kKeyMode: the
// coordinate mode holding the key (the other holds the query row).
template <int kKeyMode, class TensorC>
struct AlibiBiasAt {
  TensorC const& tScS;
  float key_first, d_first;  // entry 0's key and row + seqlen_k - seqlen_q - key

  FLASH_HOST_DEVICE AlibiBiasAt(TensorC const& c, int row0, int col0, int seqlen_q, int seqlen_k)
      : tScS(c),
        key_first(float(col0 + int(cute::get<kKeyMode>(c(0))))),
        d_first(float(row0 + int(cute::get<1 - kKeyMode>(c(0))) + seqlen_k - seqlen_q - col0 -
                      int(cute::get<kKeyMode>(c(0))))) {}

  // Entry i's key and row, less entry 0's: compile-time constants in an unrolled loop.
  FLASH_HOST_DEVICE float key_offset(int i) const {
    return float(int(cute::get<kKeyMode>(tScS(i))) - int(cute::get<kKeyMode>(tScS(0))));
  }
  FLASH_HOST_DEVICE float row_offset(int i) const {
    return float(int(cute::get<1 - kKeyMode>(tScS(i))) - int(cute::get<1 - kKeyMode>(tScS(0))));
  }

  // slope_scaled * the symmetric form at entry i: an add and an FFMA (|x| is an operand modifier).
  FLASH_HOST_DEVICE float symmetric(int i, float slope_scaled) const {
    return -slope_scaled * fabsf(d_first + (row_offset(i) - key_offset(i)));
  }

  // Left of its row's diagonal (d >= 0: every key a causal kernel's rows see), entry i's bias in
  // either form, times `scale`, is scale * slope_scaled * key_offset(i) (an FFMA of the score) plus
  // a linear function of its row, first + step * row_offset(i) (a constant of the row).
  struct RowPart {
    float first, step;
  };
  FLASH_HOST_DEVICE RowPart row_part(float slope_scaled, bool causal_form, float scale) const {
    const float slope = slope_scaled * scale;
    return causal_form ? RowPart{slope * key_first, 0.f} : RowPart{-slope * d_first, -slope};
  }
};

// Adds slope_scaled * alibi_bias to every score of the tile (slope_scaled = slope / softmax_scale),
// the causal form measured from column causal_col_ref: slope_scaled * (col - causal_col_ref).
template <class TensorS, class TensorC>
FLASH_HOST_DEVICE void apply_alibi(TensorS& tSrS, TensorC const& tScS, int row0, int col0, int seqlen_q, int seqlen_k,
                                   bool causal_form, float slope_scaled, int causal_col_ref = 0) {
  cute::Tensor s = cute::make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
  for_each_alibi_bias(tScS, row0, causal_form ? col0 - causal_col_ref : col0, seqlen_q, seqlen_k, causal_form,
                      slope_scaled, [&](int mi, int ni, float bias) { s(mi, ni) += bias; });
}

// Sets every score of the tile to slope_scaled * the symmetric form of alibi_bias: S's initial
// value before the Q K^T gemm accumulates into it.
template <class TensorS, class TensorC>
FLASH_HOST_DEVICE void fill_alibi(TensorS& tSrS, TensorC const& tScS, int row0, int col0, int seqlen_q, int seqlen_k,
                                  float slope_scaled) {
  cute::Tensor s = cute::make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
  for_each_alibi_bias<true>(tScS, row0, col0, seqlen_q, seqlen_k, false, slope_scaled,
                            [&](int mi, int ni, float bias) { s(mi, ni) = bias; });
}

// ALiBi's side form, for a tile wholly left or wholly right of the diagonals of all its rows (a
// walk's blocks after its diagonal_steps, block_info.h): the symmetric form there is
// side_slope * (col - diag(row)), side_slope being slope_scaled on the left and -slope_scaled on
// the right, diag(row) = row + seqlen_k - seqlen_q. apply_alibi_side adds side_slope times each
// column's offset from the thread's first column col_first, one FFMA a score with a compile-time
// offset; alibi_side_shift gives the rest of each row's bias, side_slope * (col_first - diag(row)),
// which the caller takes out of the exponents' offsets (Softmax::exponentiate_shifted). The column
// offsets stay within the tile, so the scores keep their size; the shift, whatever its size, is
// exact up to its product's rounding.
template <class TensorS, class TensorC>
FLASH_HOST_DEVICE void apply_alibi_side(TensorS& tSrS, TensorC const& tScS, float side_slope) {
  cute::Tensor s = cute::make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
  cute::Tensor c = cute::make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));  // (rows, cols) -> (m, n)
#pragma unroll
  for (int ni = 1; ni < cute::size<1>(s); ++ni) {  // column 0's offset is 0
    const float col_offset = float(cute::get<1>(c(0, ni)) - cute::get<1>(c(0, 0)));
#pragma unroll
    for (int mi = 0; mi < cute::size<0>(s); ++mi) s(mi, ni) = fmaf(side_slope, col_offset, s(mi, ni));
  }
}

template <class TensorRow, class TensorC>
FLASH_HOST_DEVICE void alibi_side_shift(TensorRow& shift, TensorC const& tScS, int row0, int col0, int seqlen_q,
                                        int seqlen_k, float side_slope) {
  cute::Tensor c = cute::make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));  // (rows, cols) -> (m, n)
  const int col_first = col0 + cute::get<1>(c(0, 0));
#pragma unroll
  for (int mi = 0; mi < cute::size<0>(c); ++mi) {
    const int diag = row0 + cute::get<0>(c(mi, 0)) + seqlen_k - seqlen_q;
    shift(mi) = side_slope * float(col_first - diag);
  }
}

// lse: one natural-log LSE per row of the (rows, cols) view of tScS, computed with the symmetric
// ALiBi form; slope: the unscaled slope. Shifts it to the causal form's LSE (flash-attn's), or
// with a negative slope back; col_ref: the causal form's first column (apply_alibi).
template <class TensorRow, class TensorC>
FLASH_HOST_DEVICE void shift_alibi_lse(TensorRow& lse, TensorC const& tScS, int row0, int seqlen_q, int seqlen_k,
                                       float slope, int col_ref = 0) {
  cute::Tensor c = cute::make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));  // (rows, cols) -> (m, n)
#pragma unroll
  for (int mi = 0; mi < cute::size<0>(c); ++mi) {
    lse(mi) += slope * float(alibi_causal_shift(row0 + cute::get<0>(c(mi, 0)), seqlen_q, seqlen_k) - col_ref);
  }
}

// Softcap: score s becomes tanh(s * softcap) (the softmax then scales by the cap), i.e. the logit
// cap * tanh(s * softmax_scale / cap). tanh.approx, as flash-attn 2.x.
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <class TensorS>
__device__ __forceinline__ void apply_softcap(TensorS& tSrS, float softcap) {
#pragma unroll
  for (int i = 0; i < cute::size(tSrS); ++i) tSrS(i) = fast_tanh(tSrS(i) * softcap);
}
#endif

}  // namespace flash_attn_cute
