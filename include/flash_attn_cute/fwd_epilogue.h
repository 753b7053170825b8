// Writes one normalised row block of O (through shared memory, as 16-byte vectors) and its LSE.
#pragma once

#include <cute/tensor.hpp>

#include "kernel_traits.h"
#include "utils.h"

namespace flash_attn_cute {

using namespace cute;

// tOrO: the normalised fp32 O accumulator (MMA, MMA_M, MMA_K); lse: one value per accumulator row.
// gO: this row block's (kBlockM, kHeadDim) tile of O; gLSE: (kBlockM) slice of softmax_lse.
// sO may alias Q's shared memory: the caller guarantees no thread still reads the rows of Q that
// this thread's part of sO overlaps (every warp done with Q, or, in the warp-specialized kernel,
// each consumer done with its own rows).
// sync: the barrier of the threads that share sO, or with kRowGroups of each group of rows
// (store_tile_via_smem).
template <class Traits, bool Is_even_K, int kRowGroups = 1, class TensorO, class TensorLse, class TensorGO,
          class TensorSO, class TensorGLse, class Sync = SyncThreads>
__device__ __forceinline__ void write_o(TensorO const& tOrO, TensorLse const& lse, TensorGO& gO, TensorSO& sO,
                                        TensorGLse& gLSE, int rows_left, int head_dim, int tidx, Sync sync = {}) {
  using Element = typename Traits::Element;
  typename Traits::TiledMma tiled_mma;
  // LSE: the thread holding column 0 of a row writes it.
  Tensor taccOcO = tiled_mma.get_thread_slice(tidx).partition_C(
      make_identity_tensor(Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{}));  // (MMA, MMA_M, MMA_K)
  Tensor taccOcO_rc = make_tensor(taccOcO.data(), acc_layout_rowcol(taccOcO.layout()));  // (rows, cols)
  static_assert(decltype(size<0>(taccOcO_rc))::value == decltype(size(lse))::value);
  if (get<1>(taccOcO_rc(0, 0)) == 0) {
#pragma unroll
    for (int mi = 0; mi < size(lse); ++mi) {
      const int row = get<0>(taccOcO_rc(mi, 0));
      if (row < rows_left) gLSE(row) = lse(mi);
    }
  }
  store_tile_via_smem<typename Traits::SmemCopyAtomO, typename Traits::GmemTiledCopyO, Is_even_K, kRowGroups>(
      tiled_mma, convert_type<Element>(tOrO), sO, gO, rows_left, head_dim, tidx, sync);
}

// O's rounding residual O - O_rounded in the element type, for the backward's D = rowsum(dO * O):
// the rounded O alone leaves an error in D that dropout's scaled, no longer convex sums make large.
template <class Element, class TensorO>
__device__ __forceinline__ auto rounding_residual(TensorO const& tOrO) {
  Tensor res = make_tensor<float>(tOrO.layout());
#pragma unroll
  for (int i = 0; i < size(tOrO); ++i) res(i) = tOrO(i) - float(Element(tOrO(i)));
  return convert_type<Element>(res);
}

// One split's partial result, straight from registers: fp32 O (normalised by the split's own sum)
// into gOaccum, a (kBlockM, kHeadDim) row-major fp32 tile, and LSE into gLSEaccum, with -inf for
// rows that saw no key in this split (the combine then gives them no weight). Rows at or past
// rows_left are not ours.
template <class Traits, class TensorO, class TensorLse>
__device__ __forceinline__ void write_o_partial(TensorO const& tOrO, TensorLse lse, float* gOaccum, float* gLSEaccum,
                                                int rows_left, int tidx) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  typename Traits::TiledMma tiled_mma;
  Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});                   // (BLK_M, BLK_K) -> (m, k)
  Tensor taccOcO = tiled_mma.get_thread_slice(tidx).partition_C(cO);                       // (MMA, MMA_M, MMA_K)
  Tensor coord_rc = make_tensor(taccOcO.data(), acc_layout_rowcol(taccOcO.layout()));     // (rows, cols)
  Tensor acc_rc = make_tensor(tOrO.data(), acc_layout_rowcol(tOrO.layout()));              // (rows, cols)
#pragma unroll
  for (int mi = 0; mi < size<0>(acc_rc); ++mi) {
    const int row = get<0>(coord_rc(mi, 0));
    if (row >= rows_left) continue;
    float* out_row = gOaccum + row * kHeadDim;
#pragma unroll
    for (int ni = 0; ni < size<1>(acc_rc); ni += 2) {
      *reinterpret_cast<float2*>(out_row + get<1>(coord_rc(mi, ni))) = make_float2(acc_rc(mi, ni), acc_rc(mi, ni + 1));
    }
    if (get<1>(coord_rc(mi, 0)) == 0) gLSEaccum[row] = lse(mi) == INFINITY ? -INFINITY : lse(mi);
  }
}

}  // namespace flash_attn_cute
