// Register-level helpers shared by the kernels: layout views of MMA accumulators, type
// conversion, the two shapes of tiled GEMM, quad reductions and predicated tile copies.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace flash_attn_cute {

using namespace cute;

// An MMA accumulator layout seen as (rows, cols). m16n8k16 (mma.sync): ((2, 2), MMA_M, MMA_N) ->
// ((2, MMA_M), (2, MMA_N)); each thread holds two rows per MMA_M and two adjacent columns per MMA_N.
// A warpgroup MMA (sm_90a) of N columns: ((2, 2, N / 8), MMA_M, MMA_N) -> ((2, MMA_M), (2, N / 8,
// MMA_N)), the same two rows per thread (a warp owns 16 of the 64) and pairs of columns every 8.
template <class Layout>
__host__ __device__ constexpr auto acc_layout_rowcol(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3);
  if constexpr (decltype(rank<0>(acc))::value == 3) {
    static_assert(decltype(size<0, 0>(acc))::value == 2 && decltype(size<0, 1>(acc))::value == 2);
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
  } else {
    static_assert(decltype(size<0>(acc))::value == 4);
    auto l = logical_divide(acc, Shape<_2>{});  // ((2, 2), MMA_M, MMA_N)
    return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
  }
}

// The same accumulator registers reinterpreted as the A operand of a k16 MMA; this is how P feeds
// O += P V. m16n8k16: ((2, 2), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, MMA_N / 2). Warpgroup MMA:
// ((2, 2, N / 8), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, N / 16 * MMA_N), a k16 slab being two
// consecutive 8-column groups.
template <class Layout>
__host__ __device__ constexpr auto acc_layout_as_A(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3);
  if constexpr (decltype(rank<0>(acc))::value == 3) {
    static_assert(decltype(size<0, 2>(acc))::value % 2 == 0, "whole k16 slabs: N a multiple of 16");
    auto v = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});  // (2, 2, (2, N / 16))
    return make_layout(make_layout(get<0>(v), get<1>(v), get<2, 0>(v)), get<1>(acc),
                       coalesce(make_layout(get<2, 1>(v), get<2>(acc))));
  } else {
    static_assert(decltype(size<0>(acc))::value == 4);
    auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // (4, MMA_M, (2, MMA_N / 2))
    return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
  }
}

// Rows [row0, row0 + kRows) of a row-major matrix whose rows lie row_stride elements apart, as a
// (kRows, kCols) global tile: a row block of Q, O or dQ, a key block of K or V.
template <int kRows, int kCols, class Element>
__device__ __forceinline__ auto gmem_row_tile(Element* ptr, int64_t row_stride, int64_t row0) {
  return make_tensor(make_gmem_ptr(ptr + row0 * row_stride), Shape<Int<kRows>, Int<kCols>>{},
                     make_stride(row_stride, _1{}));
}

// The same matrix as n consecutive such tiles, (kRows, kCols, n): K's or V's key blocks.
template <int kRows, int kCols, class Element>
__device__ __forceinline__ auto gmem_row_tiles(Element* ptr, int64_t row_stride, int n) {
  return make_tensor(make_gmem_ptr(ptr), make_shape(Int<kRows>{}, Int<kCols>{}, n),
                     make_stride(row_stride, _1{}, row_stride * kRows));
}

// The same partitioned tile, slot slots of slot_elems elements further on in shared memory (a
// multi-buffered tile).
template <class TensorT>
__device__ __forceinline__ auto in_slot(TensorT const& t, int slot, int slot_elems) {
  return make_tensor(t.data() + slot * slot_elems, t.layout());
}

// A register tensor converted element-wise (e.g. fp32 accumulators to the 16-bit input type).
template <class To, class Engine, class Layout>
__device__ __forceinline__ auto convert_type(Tensor<Engine, Layout> const& src) {
  using From = typename Engine::value_type;
  constexpr int kNumel = decltype(size(src))::value;
  Tensor dst = make_tensor<To>(src.layout());
  cutlass::NumericArrayConverter<To, From, kNumel> convert;
  *reinterpret_cast<cutlass::Array<To, kNumel>*>(dst.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, kNumel> const*>(src.data()));
  return dst;
}

// acc += A B with both operands in shared memory. Slab k + 1 is loaded into registers
// (ldmatrix) while the MMAs of slab k run.
template <class TiledMma, class TensorAcc, class TensorRA, class TensorRB, class TensorSA,
          class TensorSB, class CopyA, class CopyB>
__device__ __forceinline__ void gemm_ss(TiledMma& tiled_mma, TensorAcc& acc, TensorRA& tCrA, TensorRB& tCrB,
                                        TensorSA const& tCsA, TensorSB const& tCsB, CopyA const& copy_A,
                                        CopyB const& copy_B, int tidx) {
  auto thr_copy_A = copy_A.get_thread_slice(tidx);
  auto thr_copy_B = copy_B.get_thread_slice(tidx);
  Tensor tCrA_view = thr_copy_A.retile_D(tCrA);  // (CPY, CPY_M, CPY_K)
  Tensor tCrB_view = thr_copy_B.retile_D(tCrB);  // (CPY, CPY_N, CPY_K)
  copy(copy_A, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
  copy(copy_B, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
#pragma unroll
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k + 1 < size<2>(tCrA)) {
      copy(copy_A, tCsA(_, _, k + 1), tCrA_view(_, _, k + 1));
      copy(copy_B, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    }
    gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// acc += A B with one operand already in registers and the other, `loaded` (tCrA or tCrB itself),
// loaded from shared memory (tCs) by copy_op: slab k + 1 while the MMAs of slab k run. The SM80
// forward's P V (P in registers), the backward's dO V^T with V in registers (Traits::kVInRegs).
template <class TiledMma, class TensorAcc, class TensorRA, class TensorRB, class TensorR, class TensorS, class Copy>
__device__ __forceinline__ void gemm_loading(TiledMma& tiled_mma, TensorAcc& acc, TensorRA const& tCrA,
                                             TensorRB const& tCrB, TensorR& loaded, TensorS const& tCs,
                                             Copy const& copy_op, int tidx) {
  Tensor loaded_view = copy_op.get_thread_slice(tidx).retile_D(loaded);  // (CPY, CPY_MN, CPY_K)
  copy(copy_op, tCs(_, _, _0{}), loaded_view(_, _, _0{}));
#pragma unroll
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k + 1 < size<2>(tCrA)) copy(copy_op, tCs(_, _, k + 1), loaded_view(_, _, k + 1));
    gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// The four lanes of a quad hold the same accumulator rows; reduce across them.
template <class Op>
__device__ __forceinline__ float quad_allreduce(float x, Op op) {
#pragma unroll
  for (int offset = 2; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffff, x, offset));
  return x;
}

// Copies a partitioned tile vector by vector; vectors whose (row, col) falls outside
// [0, max_row) x [0, max_col) are zeroed in the destination instead (no out-of-bounds read).
// Check_rows / Check_cols = false skip the test for tiles known to be full in that direction.
// tS, tD, tC: (CPY, CPY_M, CPY_K); tC holds each element's (row, col) inside the tile.
template <bool Check_rows, bool Check_cols, class TiledCopy, class TensorS, class TensorD, class TensorC>
__device__ __forceinline__ void copy_or_zero(TiledCopy const& tiled_copy, TensorS const& tS, TensorD&& tD,
                                             TensorC const& tC, int max_row, int max_col) {
#pragma unroll
  for (int m = 0; m < size<1>(tS); ++m) {
#pragma unroll
    for (int k = 0; k < size<2>(tS); ++k) {
      if ((!Check_rows || get<0>(tC(0, m, k)) < max_row) && (!Check_cols || get<1>(tC(0, m, k)) < max_col)) {
        copy(tiled_copy, tS(_, m, k), tD(_, m, k));
      } else {
        clear(tD(_, m, k));
      }
    }
  }
}

// copy_or_zero with a zero-filling cp.async (TiledCopyAsyncZfill): the zeros too are written by the
// copy, not by stores of the thread (no per-element swizzled addresses to hold, and the zeros land
// with the copies, e.g. for an mbarrier that tracks them). Out-of-bounds vectors read nothing.
template <bool Check_rows, bool Check_cols, class TiledCopy, class TensorS, class TensorD, class TensorC>
__device__ __forceinline__ void copy_or_zfill(TiledCopy const& tiled_copy, TensorS const& tS, TensorD&& tD,
                                              TensorC const& tC, int max_row, int max_col) {
#pragma unroll
  for (int m = 0; m < size<1>(tS); ++m) {
#pragma unroll
    for (int k = 0; k < size<2>(tS); ++k) {
      const bool in = (!Check_rows || get<0>(tC(0, m, k)) < max_row) && (!Check_cols || get<1>(tC(0, m, k)) < max_col);
      copy(tiled_copy.with(in), tS(_, m, k), tD(_, m, k));
    }
  }
}

// copy_or_zero for sources whose rows are found one by one (a paged KV cache): tile row r starts at
// src + row_offset(r), or does not exist when row_offset(r) < 0 and is zeroed like rows past max_row.
template <bool Check_rows, bool Check_cols, class TiledCopy, class Element, class RowOffset, class TensorD,
          class TensorC>
__device__ __forceinline__ void copy_rows_or_zero(TiledCopy const& tiled_copy, Element const* src,
                                                  RowOffset const& row_offset, TensorD&& tD, TensorC const& tC,
                                                  int max_row, int max_col) {
#pragma unroll
  for (int m = 0; m < size<1>(tD); ++m) {
    const int row = get<0>(tC(0, m, 0));
    const int64_t offset = !Check_rows || row < max_row ? row_offset(row) : -1;
#pragma unroll
    for (int k = 0; k < size<2>(tD); ++k) {
      const int col = get<1>(tC(0, m, k));
      if (offset >= 0 && (!Check_cols || col < max_col)) {
        Tensor tS = make_tensor(make_gmem_ptr(src + offset + col), make_layout(shape(tD(_, m, k))));
        copy(tiled_copy, tS, tD(_, m, k));
      } else {
        clear(tD(_, m, k));
      }
    }
  }
}

// The same walk for stores: vectors outside the bounds are skipped.
template <bool Check_cols, class TiledCopy, class TensorS, class TensorD, class TensorC>
__device__ __forceinline__ void copy_in_bounds(TiledCopy const& tiled_copy, TensorS const& tS, TensorD&& tD,
                                               TensorC const& tC, int max_row, int max_col) {
#pragma unroll
  for (int m = 0; m < size<1>(tS); ++m) {
#pragma unroll
    for (int k = 0; k < size<2>(tS); ++k) {
      if (get<0>(tC(0, m, k)) < max_row && (!Check_cols || get<1>(tC(0, m, k)) < max_col)) {
        copy(tiled_copy, tS(_, m, k), tD(_, m, k));
      }
    }
  }
}

// The barrier of the CTA's threads that share a tile in shared memory: all of them by default; the
// warp-specialized kernel's consumers pass their named barrier.
struct SyncThreads {
  __device__ void operator()() const { __syncthreads(); }
};

// Stores rTile, an MMA-layout register tile of tiled_mma's output (in the element type), to gTile:
// into sTile through the tiled copy C of SmemCopyAtom, a barrier, then out in GmemTiledCopy's
// 16-byte vectors, predicated on rows (rows_left) and, unless Is_even_K, columns (head_dim). sTile
// must be free (the caller has synchronised); it is still being read when this returns.
// kRowGroups > 1: the tile's rows are that many equal groups, each the rows of tiled_mma's threads
// tidx / size(GmemTiledCopy) (the warp-specialized forward's consumers), which store their own
// group alone: sync need only be the group's barrier.
template <class SmemCopyAtom, class GmemTiledCopy, bool Is_even_K, int kRowGroups = 1, class TiledMma, class TensorR,
          class TensorS, class TensorG, class Sync = SyncThreads>
__device__ __forceinline__ void store_tile_via_smem(TiledMma const& tiled_mma, TensorR const& rTile, TensorS& sTile,
                                                    TensorG& gTile, int rows_left, int head_dim, int tidx,
                                                    Sync sync = {}) {
  auto smem_tiled_copy = make_tiled_copy_C(SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy = smem_tiled_copy.get_thread_slice(tidx);
  copy(smem_tiled_copy, smem_thr_copy.retile_S(rTile), smem_thr_copy.partition_D(sTile));
  sync();
  constexpr int kGroupThreads = decltype(size(GmemTiledCopy{}))::value;
  constexpr int kGroupRows = decltype(size<0>(sTile))::value / kRowGroups;
  const int group = kRowGroups == 1 ? 0 : tidx / kGroupThreads;
  auto group_rows = [&](auto& tile) {  // (kGroupRows, cols)
    return local_tile(tile, make_shape(Int<kGroupRows>{}, size<1>(tile)), make_coord(group, _0{}));
  };
  Tensor sRows = group_rows(sTile);
  GmemTiledCopy gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(kRowGroups == 1 ? tidx : tidx % kGroupThreads);
  Tensor tTsT = gmem_thr_copy.partition_S(sRows);                                   // (CPY, CPY_ROW, CPY_K)
  Tensor tTcT = gmem_thr_copy.partition_D(
      make_identity_tensor(make_shape(size<0>(sRows), size<1>(sRows))));  // (CPY, CPY_ROW, CPY_K) -> (row, k)
  Tensor tTrT = make_fragment_like(tTsT);
  copy(gmem_tiled_copy, tTsT, tTrT);
  copy_in_bounds<!Is_even_K>(gmem_tiled_copy, tTrT, gmem_thr_copy.partition_D(group_rows(gTile)), tTcT,
                             rows_left - group * kGroupRows, head_dim);
}

}  // namespace flash_attn_cute
