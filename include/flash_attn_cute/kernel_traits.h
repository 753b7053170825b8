// Compile-time description of one forward kernel: tile shape, MMA atom, shared-memory layouts and
// the copies between global, shared and register memory (SM80 mma.sync / cp.async / ldmatrix).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "params.h"
#include "tile_size.h"

namespace flash_attn_cute {

using namespace cute;

// The CUTLASS element type of a DType.
template <DType kDType>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat16> {
  using type = cutlass::half_t;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
};

template <typename Element>
struct Sm80MmaAtom;
template <>
struct Sm80MmaAtom<cutlass::half_t> {
  using type = MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>;
};
template <>
struct Sm80MmaAtom<cutlass::bfloat16_t> {
  using type = MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>;
};

// Global <-> shared copies of (rows, kHeadDim) tiles: each thread moves 16-byte vectors; a row of a
// 64- (or 32-) column chunk is covered by kThreadsPerRow threads, the CTA covers
// kNThreads / kThreadsPerRow rows per pass.
template <typename Element, int kNThreads, int kHeadDim>
struct GmemCopies {
  static constexpr int kElemsPerVector = sizeof(uint128_t) / sizeof(Element);
  static constexpr int kThreadsPerRow = (kHeadDim % 64 == 0 ? 64 : 32) / kElemsPerVector;
  static_assert(kNThreads % kThreadsPerRow == 0);
  using ThreadLayout = Layout<Shape<Int<kNThreads / kThreadsPerRow>, Int<kThreadsPerRow>>, Stride<Int<kThreadsPerRow>, _1>>;
  using VectorLayout = Layout<Shape<_1, Int<kElemsPerVector>>>;
  using TiledCopyAsync = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, Element>{},
                                                  ThreadLayout{}, VectorLayout{}));
  using TiledCopyStore = decltype(make_tiled_copy(Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>{},
                                                  ThreadLayout{}, VectorLayout{}));
  // cp.async that writes zeros where its predicate is off (copy_or_zfill).
  using TiledCopyAsyncZfill = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, Element>{},
                                                       ThreadLayout{}, VectorLayout{}));
};

// kIsSplit: the split-KV kernel's tile (fwd_split_tile_shape), else kVariant's (fwd_tile_shape; its
// small tiles with kSmallSmem).
template <int kHeadDim_, bool kIsCausal, typename Element_, bool kIsSplit = false,
          Variant kVariant = Variant::kPlain, bool kSmallSmem_ = false>
struct FwdKernelTraits {
  using Element = Element_;
  using ElementAccum = float;

  static constexpr bool kSmallSmem = kSmallSmem_;
  static constexpr FwdTileShape kTile =
      kIsSplit ? fwd_split_tile_shape(kHeadDim_) : fwd_tile_shape(kHeadDim_, kIsCausal, kVariant, kSmallSmem);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kNWarps = kTile.n_warps;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kHeadDim % 32 == 0 && kBlockM % (16 * kNWarps) == 0);
  // The softmax's lazy rescale (softmax.h) saves a multiply per O element per key block, for a warp
  // vote and registers. Up to head dim 64 (S in 128 registers per thread) it cost spills and speed;
  // in the score-mod kernels it took the spill instructions from 7-18 to 150-189 (hdim 128).
  static constexpr bool kLazyRescale = kHeadDim > 64 && kVariant != Variant::kScoreMods;

  // Warps stack along M; each computes 16-row slabs of S = Q K^T and O = P V.
  using TiledMma = TiledMMA<typename Sm80MmaAtom<Element>::type, Layout<Shape<Int<kNWarps>, _1, _1>>,
                            Tile<Int<16 * kNWarps>, _16, _16>>;

  // Shared memory rows are cut into 64- (or 32-) element chunks; the swizzle spreads the 16-byte
  // vectors of 8 consecutive rows over all banks, so both cp.async writes and ldmatrix reads of a
  // column slab are conflict-free.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kBlockKSmem == 64 ? 3 : 2;
  using SmemLayoutAtom = decltype(composition(
      Swizzle<kSwizzleBits, 3, 3>{}, Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V read as the B operand of O = P V needs (head_dim, n) with n contiguous: the same bytes, viewed
  // transposed, and read back with the transposing ldmatrix.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));  // register fragment shape
  using SmemLayoutO = SmemLayoutQ;  // the output tile reuses Q's shared memory

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  static constexpr int kSmemQBytes = cosize_v<SmemLayoutQ> * sizeof(Element);
  static constexpr int kSmemKVBytes = cosize_v<SmemLayoutKV> * sizeof(Element);
  static constexpr int kSmemBytes = kSmemQBytes + 2 * kSmemKVBytes;
  static_assert(kSmemBytes == fwd_smem_bytes(kTile, kHeadDim));

  using GmemTiledCopyQKV = typename GmemCopies<Element, kNThreads, kHeadDim>::TiledCopyAsync;
  using GmemTiledCopyO = typename GmemCopies<Element, kNThreads, kHeadDim>::TiledCopyStore;
};

}  // namespace flash_attn_cute
