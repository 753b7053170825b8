// Compile-time description of one backward kernel: its tiles, the three tiled MMAs (S / dP, dK /
// dV, dQ), shared-memory layouts with the transposed views the MMAs read, and the copies.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "bwd_api.h"
#include "kernel_traits.h"
#include "params.h"
#include "tile_order.h"
#include "tile_size.h"

namespace flash_attn_cute {

using namespace cute;

// DqAccumulator's state in shared memory (bwd_epilogue.h), written and read by thread 0 only.
struct DqHandOn {
  int* turn;     // the counter of the row block this step adds to (poll_turn), or nullptr
  int seen;      // what poll_turn read from it
  int next;      // the key block each tile passes the turn to (dq_next_key_block)
  int* pending;  // the counter of the tile added since the last barrier, or nullptr
};

// The (key block, batch, KV head) CTA `cta` of a backward launch's 1-D grid (both backward kernels):
// the persistent forward's order (tile_order.h) with key blocks for row blocks, the (batch, KV head)
// pairs in sections, key-block-major within a section. Causal key block 0 walks the most row blocks,
// so each section starts with its heaviest CTAs, and a section's pairs keep their Q, dO and fp32 dQ
// accumulator rows (every query head of the group) in L2 together. Non-causal, a section is one
// pair. Measured on H200 (bf16, causal, the Hopper backward), against every pair's key block 0
// first, then every pair's key block 1, ... (Nsight Compute put that order at 72 % of DRAM
// throughput at hdim 128, 2k tokens, FA2's at 11 %): hdim 128 158 / 246 / 323 / 382 TFLOP/s at 512 /
// 1k / 2k / 4k tokens against 147 / 206 / 281 / 359, 441 against 435 at 16k; hdim 64 201 against
// 177 at 1k, 315 against 290 at 4k; non-causal unchanged. The SM80 backward (its causal grid was
// that order too): hdim 256 139 / 184 / 220 against 116 / 147 / 211 at 512 / 1k / 2k, 265 against
// 261 at 16k; hdim 128 264 / 304 / 343 against 254 / 294 / 335 at 2k / 4k / 16k.
template <int kHeadDim, int kBlockN, typename Element, bool Is_causal>
FLASH_HOST_DEVICE FwdWsTile bwd_cta_tile(BwdParams const& params, int cta) {
  constexpr int kRowBytes = kHeadDim * (2 * sizeof(Element) + sizeof(float));
  const int64_t pair_bytes = int64_t(params.seqlen_q) * kRowBytes * (params.heads / params.heads_k);
  const FwdWsTileOrder order = FwdWsTileOrder::make((params.seqlen_k + kBlockN - 1) / kBlockN, params.batch,
                                                    params.heads_k, pair_bytes, Is_causal);
  return order.tile<false>(cta);  // key block 0 first
}

// kSmallSmem: bwd_tile_shape's small tiles (GPUs with less shared memory a block: bwd_small_smem);
// with kVInRegs, bwd_v_in_regs_tile_shape's.
template <int kHeadDim_, typename Element_, bool kSmallSmem_ = false, bool kVInRegs_ = false>
struct BwdKernelTraits {
  using Element = Element_;
  using ElementAccum = float;

  static constexpr bool kSmallSmem = kSmallSmem_;
  static constexpr bool kVInRegs = kVInRegs_;
  static_assert(!kVInRegs || kSmallSmem);
  static constexpr BwdTileShape kTile = kVInRegs ? bwd_v_in_regs_tile_shape() : bwd_tile_shape(kHeadDim_, kSmallSmem);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTile.block_m;
  static_assert(kBlockM % kDqSemaphoreRowBlock == 0, "the dQ counters (bwd_api.cpp) hold this row block's");
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kNWarps = kTile.n_warps;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kDqThreads = kNThreads;  // the dQ MMA's (bwd_convert_dq_fragments_kernel)
  static constexpr int kDqVec = 2;              // and its fragment order's groups (dq_fragment_offset)
  static constexpr int kQSlots = kTile.q_slots;
  static_assert(kHeadDim % 32 == 0 && (kQSlots == 1 || kQSlots == 2));

  // Each warp covers 16 x 16 of its MMA's output per atom step; warps split the two output modes
  // as the tile table says.
  using MmaAtom = typename Sm80MmaAtom<Element>::type;
  template <int kWarpsM>
  using WarpTiledMma = TiledMMA<MmaAtom, Layout<Shape<Int<kWarpsM>, Int<kNWarps / kWarpsM>, _1>>,
                                Tile<Int<16 * kWarpsM>, Int<16 * kNWarps / kWarpsM>, _16>>;
  // S and dP: each warp owns 32 whole key columns (its atoms' columns permuted together), the
  // 16 x 32 chunk of one lane that dropout draws at once (dropout.h). Warp w of the N mode holds
  // columns [32 w, 32 w + 32) of every 32 * warps_n. The V-in-registers tile (no dropout) has 16
  // columns a warp.
  static constexpr int kWarpsNSdP = kNWarps / kTile.atom_m_sdp;
  static_assert(kBlockN % ((kVInRegs ? 16 : 32) * kWarpsNSdP) == 0);
  using TiledMmaSdP = std::conditional_t<
      kVInRegs, WarpTiledMma<kTile.atom_m_sdp>,
      TiledMMA<MmaAtom, Layout<Shape<Int<kTile.atom_m_sdp>, Int<kWarpsNSdP>, _1>>,
               Tile<Int<16 * kTile.atom_m_sdp>, Layout<Shape<_8, Int<kWarpsNSdP>, _4>, Stride<_1, _32, _8>>, _16>>>;  // Q K^T, dO V^T
  using TiledMmadKV = WarpTiledMma<kTile.atom_n_dkv>;  // (kBlockN, kHeadDim) = P^T dO, dS^T Q
  using TiledMmadQ = WarpTiledMma<kTile.atom_m_dq>;    // (kBlockM, kHeadDim) = dS K

  // Row-major (rows, cols) tiles cut into 64- (or 32-) column swizzled chunks, as in the forward.
  template <int kCols>
  using SwizzledAtom = decltype(composition(
      Swizzle<kCols % 64 == 0 ? 3 : 2, 3, 3>{},
      Layout<Shape<_8, Int<kCols % 64 == 0 ? 64 : 32>>, Stride<Int<kCols % 64 == 0 ? 64 : 32>, _1>>{}));
  // (cols, rows) view of a (rows, cols) layout: the operand of a GEMM that reads the tile transposed.
  template <class L, int kRows, int kCols>
  using Transposed = decltype(composition(L{}, make_layout(Shape<Int<kCols>, Int<kRows>>{}, GenRowMajor{})));

  using SmemLayoutQ = decltype(tile_to_shape(SwizzledAtom<kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SwizzledAtom<kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutQt = Transposed<SmemLayoutQ, kBlockM, kHeadDim>;    // (kHeadDim, kBlockM): Q, dO
  using SmemLayoutKt = Transposed<SmemLayoutKV, kBlockN, kHeadDim>;   // (kHeadDim, kBlockN)
  using SmemLayoutPdS = decltype(tile_to_shape(SwizzledAtom<kBlockN>{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using SmemLayoutPdSt = Transposed<SmemLayoutPdS, kBlockM, kBlockN>;  // (kBlockN, kBlockM)
  // Register fragments of the transposed operands are shaped on the layouts without the swizzle.
  using SmemLayoutQtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutQt{}));
  using SmemLayoutKtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutKt{}));
  using SmemLayoutPdStNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutPdSt{}));

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomPdS = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  // Shared memory, in this order: Q x kQSlots, dO x kQSlots (with two, the next row block loads
  // while this one runs), K, V, P, dS (with kVInRegs inside V's, once V is in registers), then the
  // fp32 LSE and D of the row block x kQSlots (they load with its Q and dO) and DqAccumulator's
  // hand-on slots (DqHandOn). The dK / dV epilogue reuses K and V.
  static constexpr int kSmemQElems = cosize_v<SmemLayoutQ>;
  static constexpr int kSmemKVElems = cosize_v<SmemLayoutKV>;
  static constexpr int kSmemPdSElems = cosize_v<SmemLayoutPdS>;
  static_assert(!kVInRegs || 2 * kSmemPdSElems <= kSmemKVElems);
  static constexpr int kSmemLseDOffset =
      (2 * kQSlots * kSmemQElems + 2 * kSmemKVElems + (kVInRegs ? 0 : 2 * kSmemPdSElems)) * sizeof(Element);
  static constexpr int kSmemDQHandOnOffset = kSmemLseDOffset + kQSlots * 2 * kBlockM * int(sizeof(float));
  static constexpr int kSmemDQHandOnBytes = int(sizeof(DqHandOn));
  static constexpr int kSmemBytes = kSmemDQHandOnOffset + kSmemDQHandOnBytes;
  static_assert(kSmemBytes == bwd_smem_bytes(kTile, kHeadDim), "16-bit elements");
  static_assert(kSmemBytes <= (kSmallSmem && (kHeadDim <= 192 || kVInRegs) ? 99 : 227) * 1024,
                "tiles over the shared memory of a block");
  static_assert(2 * kBlockM <= kNThreads, "one thread per row loads its LSE, one its D");

  using GmemTiledCopy = typename GmemCopies<Element, kNThreads, kHeadDim>::TiledCopyAsync;
  using GmemTiledCopyOut = typename GmemCopies<Element, kNThreads, kHeadDim>::TiledCopyStore;
};

}  // namespace flash_attn_cute
