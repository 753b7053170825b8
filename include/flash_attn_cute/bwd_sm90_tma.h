// TMA loads of Q and dO for the Hopper backward (bwd_kernel_sm90.h), where they fit
// (bwd_sm90_tma_fits): thread 0 issues each row block's two copies, and the row block's buffer's
// barrier (a two-buffer SmemRing) completes once their bytes have landed. Elsewhere (varlen,
// unaligned views, FLASH_ATTN_CUTE_SM90_TMA=0) every thread loads them with cp.async.
#pragma once

#include "fwd_ws_tma.h"
#include "params.h"

namespace flash_attn_cute {

using namespace cute;

// Fixed-length batches (no varlen: a row block's rows past its sequence's end must land as zeros)
// whose Q and dO TMA can load.
inline bool bwd_sm90_tma_fits(BwdParams const& p) {
  return !p.cu_seqlens_q && !p.cu_seqlens_k && tma_views_fit({&p.q, &p.dout});
}

// The descriptors of Q and dO, (seqlen_q, head_dim, heads, batch) as tma_gmem sees them, each
// loading one buffer (kBlockM, kHeadDim) of Traits::SmemLayoutQ.
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
    return bwd_sm90_tma_fits(p) && tensor_map_encodes(p.q, tma_shape_q(p), kFp16, Traits::kBlockM, kBoxCols) &&
           tensor_map_encodes(p.dout, tma_shape_q(p), kFp16, Traits::kBlockM, kBoxCols);
  }
  static BwdSm90Tma make(BwdParams const& p) {
    return {make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Element>(p.q, tma_shape_q(p)), SmemLayoutQBuffer{}, TileQ{}, _1{}),
            make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Element>(p.dout, tma_shape_q(p)), SmemLayoutQBuffer{}, TileQ{},
                          _1{})};
  }

  // Thread 0: row block m_block of head bidh, batch bidb, into use `use`'s buffers of Q and dO, their
  // barrier told to expect both copies' bytes.
  template <class Ring>
  __device__ void load(BwdParams const& p, Ring& ring, int use, Element* smem_q, Element* smem_do, int m_block,
                       int bidh, int bidb) const {
    ring.commit_tma(use, 2 * kBytesQ);
    const int offset = ring.stage(use) * cosize_v<SmemLayoutQBuffer>;
    auto load_one = [&](CopyQ const& tma, Element* smem) {
      Tensor m = tma.get_tma_tensor(tma_shape_q(p));
      Tensor g = local_tile(m(_, _, bidh, bidb), TileQ{}, make_coord(m_block, _0{}));  // (kBlockM, kHeadDim)
      Tensor s = make_tensor(make_smem_ptr(smem + offset), SmemLayoutQBuffer{});
      auto cta_tma = tma.get_slice(_0{});
      copy(tma.with(ring.full_barrier(use)), cta_tma.partition_S(g), cta_tma.partition_D(s));
    };
    load_one(q, smem_q);
    load_one(dout, smem_do);
  }
};

}  // namespace flash_attn_cute
