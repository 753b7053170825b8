// The visibility rule and its application to one tile of scores.
#pragma once

#include <cute/tensor.hpp>

#include "block_info.h"

namespace flash_attn_cute {

template <bool Is_causal>
struct FwdMask {
  int seqlen_q;
  int seqlen_k;

  // Row and column are positions in the sequence, not in the tile.
  FLASH_HOST_DEVICE constexpr bool key_visible(int row, int col) const {
    return col < seqlen_k && (!Is_causal || col <= row + seqlen_k - seqlen_q);
  }

#if defined(__CUDACC__)
  // tSrS: scores of one (kBlockM, kBlockN) tile; tScS: the (row, col) of each score inside the
  // tile, partitioned the same way. Invisible scores become -inf.
  template <class TensorS, class TensorC>
  __device__ __forceinline__ void apply(TensorS& tSrS, TensorC const& tScS, int row0, int col0) const {
    static_assert(decltype(cute::size(tSrS))::value == decltype(cute::size(tScS))::value);
#pragma unroll
    for (int i = 0; i < cute::size(tSrS); ++i) {
      if (!key_visible(row0 + cute::get<0>(tScS(i)), col0 + cute::get<1>(tScS(i)))) {
        tSrS(i) = -INFINITY;
      }
    }
  }
#endif
};

}  // namespace flash_attn_cute
