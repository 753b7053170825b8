// TMA loads of Q and dO for the Hopper backward (bwd_kernel_sm90.h), where they fit
// (bwd_sm90_tma_fits): thread 0 issues each row block's two copies, and the row block's buffer's
// barrier (a two-buffer SmemRing) completes once their bytes have landed. Elsewhere (unaligned views,
// FLASH_ATTN_CUTE_SM90_TMA=0) every thread loads them with cp.async. Varlen, a sequence's last row
// block reads the next sequence's first rows past its end (rows past the tensor's end land as
// zeros): the kernel zeroes them after they land, as cp.async would have left them.
#pragma once

#include "fwd_ws_tma.h"
#include "params.h"

namespace flash_attn_cute {

using namespace cute;

// Whether TMA can load Q and dO (varlen: packed rows, at least one, that a TMA coordinate reaches).
inline bool bwd_sm90_tma_fits(BwdParams const& p) {
  if (!tma_rows_fit(p.cu_seqlens_q, p.total_q)) return false;
  const TensorView q = tma_view_q(p.q, p), dout = tma_view_q(p.dout, p);
  return tma_views_fit({&q, &dout});
}

// The descriptors of Q and dO, of tma_shape_q's extents as tma_gmem sees them (varlen: the packed
// rows as one batch entry), each loading one buffer (kBlockM, kHeadDim) of Traits::SmemLayoutQ.
template <class Traits>
struct BwdSm90Tma {
  using Element = typename Traits::Element;
  using TileQ = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>;
  using SmemLayoutQBuffer = decltype(typename Traits::SmemLayoutQ{}(_, _, _0{}));
  static constexpr uint32_t kBytesQ = Traits::kBlockM * Traits::kHeadDim * sizeof(Element);
  static constexpr int kBoxCols = Traits::kSwizzleCols % 64 == 0 ? 64 : 32;  // the swizzle atom's row
  static_assert(sizeof(Element) == 2);

  using CopyQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Element>(TensorView{}, TmaShape{}),
                                       SmemLayoutQBuffer{}, TileQ{}, _1{}));
  CopyQ q, dout;

  // Whether the TMA loads can run for these params: they fit and the driver encodes both.
  static bool usable(BwdParams const& p) {
    constexpr bool kFp16 = std::is_same_v<Element, cutlass::half_t>;
    return bwd_sm90_tma_fits(p) &&
           tensor_map_encodes(tma_view_q(p.q, p), tma_shape_q(p), kFp16, Traits::kBlockM, kBoxCols) &&
           tensor_map_encodes(tma_view_q(p.dout, p), tma_shape_q(p), kFp16, Traits::kBlockM, kBoxCols);
  }
  static BwdSm90Tma make(BwdParams const& p) {
    auto descriptor = [&](TensorView const& view) {
      return make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Element>(tma_view_q(view, p), tma_shape_q(p)),
                           SmemLayoutQBuffer{}, TileQ{}, _1{});
    };
    return {descriptor(p.q), descriptor(p.dout)};
  }

  // Thread 0: row block m_block of head bidh, batch bidb, into use `use`'s buffers of Q and dO, their
  // barrier told to expect both copies' bytes. row_start: the sequence's first row (BlockInfo's
  // q_row_start: varlen's packed rows; 0 for fixed-length batches).
  template <class Ring>
  __device__ void load(BwdParams const& p, Ring& ring, int use, Element* smem_q, Element* smem_do, int m_block,
                       int bidh, int bidb, index_t row_start) const {
    ring.commit_tma(use, 2 * kBytesQ);
    const int offset = ring.stage(use) * cosize_v<SmemLayoutQBuffer>;
    const bool varlen = p.cu_seqlens_q != nullptr;
    auto load_one = [&](CopyQ const& tma, Element* smem) {
      Tensor s = make_tensor(make_smem_ptr(smem + offset), SmemLayoutQBuffer{});
      tma_load_row_block<TileQ>(tma, tma_shape_q(p), int(row_start), bidh, varlen ? 0 : bidb, m_block, s,
                                ring.full_barrier(use));
    };
    load_one(q, smem_q);
    load_one(dout, smem_do);
  }
};

}  // namespace flash_attn_cute
