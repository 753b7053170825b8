// Compile-time description of one Hopper forward kernel (sm_90a, fwd_kernel_sm90.h): tile shape,
// the two warpgroup MMAs (S = Q K^T from shared memory, O = P V with P in registers), their
// shared-memory layouts, and the cp.async / epilogue copies shared with the SM80 kernel.
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "fwd_mainloop.h"
#include "kernel_traits.h"

namespace flash_attn_cute {

using namespace cute;

// The 128-byte swizzled, K-major GMMA layout atom where the head dim allows it (rows of 64 16-bit
// elements), else the 64-byte one (32 elements: head dims 32 and 96).
template <typename Element, int kHeadDim>
using GmmaSmemAtomK = std::conditional_t<kHeadDim % 64 == 0, SM90::GMMA::Layout_K_SW128_Atom<Element>,
                                         SM90::GMMA::Layout_K_SW64_Atom<Element>>;

// Every fma_exp2_every-th exponential of a mask-free step is computed on the FMA pipe (softmax.h's
// exp2_fma; 0: none): with softcap at head dim 64, where a score's two MUFU operations (tanh and
// exp2) take longer than the step's MMAs. Session 26: hdim 64 softcap 7 % faster, plain hdim 64 (one
// MUFU operation a score) 7 % slower. Session 29, with softcap's fixed offset: at hdim 128 none is
// as fast at a cap of 30 and 3-4 % faster at 50 than every 4th, every 2nd 2-10 % slower. Not with
// dropout.
constexpr int fwd_sm90_fma_exp2_every(int head_dim, Variant variant, bool softcap) {
  return softcap && variant != Variant::kDropout && head_dim <= 64 ? 4 : 0;
}

template <int kHeadDim_, bool kIsCausal, typename Element_, Variant kVariant = Variant::kPlain>
struct FwdKernelTraitsSm90 {
  using Element = Element_;
  using ElementAccum = float;

  static constexpr FwdTileShape kTile = fwd_sm90_tile_shape(kHeadDim_);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kNWarps = kTile.n_warps;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kBlockM == 64 && kNWarps == 4, "one warpgroup, one 64-row warpgroup MMA");
  static constexpr int kCtasPerSm = fwd_sm90_ctas_per_sm(kHeadDim, kVariant);
  static_assert(kHeadDim % 32 == 0 && kBlockN % 16 == 0);
  // The lazy rescale (softmax.h) only in the plain kernels: unlike FwdKernelTraits, the dropout ones
  // rescale at every step too (the variant it was measured with).
  static constexpr bool kLazyRescale = kHeadDim > 64 && kVariant == Variant::kPlain;
  static constexpr int fma_exp2_every(bool softcap) { return fwd_sm90_fma_exp2_every(kHeadDim, kVariant, softcap); }

  using TileS = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;  // (M, N, K) of S = Q K^T
  using TileO = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;  // (M, N, K) of O = P V
  using TiledMmaS = decltype(make_tiled_mma(SM90::GMMA::ss_op_selector<Element, Element, ElementAccum, TileS>()));
  // V is stored key-major like K; as the B operand of P V it is read head-dim-major (MN-major).
  using TiledMma = decltype(make_tiled_mma(
      SM90::GMMA::rs_op_selector<Element, Element, ElementAccum, TileO, SM90::GMMA::Major::K,
                                 SM90::GMMA::Major::MN>()));  // O = P V; write_o reads its C layout

  using SmemLayoutQ = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // (head_dim, n): V's bytes viewed transposed.
  using SmemLayoutVt = decltype(composition(SmemLayoutKV{},
                                            make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutO = SmemLayoutQ;  // the output tile reuses Q's shared memory
  using SmemCopyAtomO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  static constexpr int kSmemQBytes = cosize_v<SmemLayoutQ> * sizeof(Element);
  static constexpr int kSmemKVBytes = cosize_v<SmemLayoutKV> * sizeof(Element);
  static constexpr int kSmemBytes = kSmemQBytes + 2 * kSmemKVBytes;
  static_assert(kSmemBytes == fwd_smem_bytes(kTile, kHeadDim));
  static_assert(kSmemQBytes % 1024 == 0 && kSmemKVBytes % 1024 == 0, "swizzle atoms start 1024-byte aligned");

  using GmemTiledCopyQKV = typename GmemCopies<Element, kNThreads, kHeadDim>::TiledCopyAsync;
  using GmemTiledCopyO = typename GmemCopies<Element, kNThreads, kHeadDim>::TiledCopyStore;
};

// The warp-specialized Hopper forward (fwd_kernel_sm90_ws.h): warpgroup 0 loads, kConsumers
// warpgroups compute, each on its own 64 query rows; K and V stream through kStages buffers each.
// The score-mod variant's bf16 softcap takes four warp-specialized kernels (run_fwd_sm90_ws), each
// of one loop (kLoops_), all with a tile of their own: the fixed offset without and with ALiBi,
// and for larger caps the same once each tile's running max reaches it (Sm90Loops).
template <typename Element, Variant kVariant>
inline constexpr bool kFwdWsSoftcapSplit = kVariant == Variant::kScoreMods && softcap_fixed_offset<true, Element>;

// kThreeConsumers_: 192-row tiles for the plain and score-mod kernels' long rows at head dim 64
// (fwd_sm90_ws_three_consumers_pay).
template <int kHeadDim_, typename Element_, Variant kVariant_ = Variant::kPlain,
          Sm90Loops kLoops_ = Sm90Loops::kPerTile, bool kThreeConsumers_ = false>
struct FwdKernelTraitsSm90Ws {
  using Element = Element_;
  using ElementAccum = float;
  static constexpr Variant kVariant = kVariant_;

  static constexpr Sm90Loops kLoops = kLoops_;
  // The split softcap kernels' steps take the fixed offset (the checked ones where it holds).
  static constexpr bool kFixedOffset = kLoops != Sm90Loops::kPerTile;
  static_assert(kLoops == Sm90Loops::kPerTile || kFwdWsSoftcapSplit<Element, kVariant>);
  static_assert(!kThreeConsumers_ ||
                (kLoops == Sm90Loops::kPerTile && fwd_sm90_ws_has_three_consumers(kHeadDim_)));
  static constexpr FwdTileShape kTile = fwd_sm90_ws_tile_shape(kHeadDim_, kFixedOffset || kThreeConsumers_);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kConsumers = kBlockM / 64;
  static constexpr int kNConsumerThreads = 128 * kConsumers;
  static constexpr int kNProducerThreads = 128;
  static constexpr int kNThreads = kNProducerThreads + kNConsumerThreads;
  static_assert(kTile.n_warps * 32 == kNThreads);
  static constexpr int kStages = kFwdSm90WsStages;
  // setmaxnreg: the producer's copies need few registers, the consumers' S, P and O many.
  static constexpr int kProducerRegs = kConsumers == 2 ? 56 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 224 : 160;
  static_assert(kNProducerThreads * kProducerRegs + kNConsumerThreads * kConsumerRegs <= 65536);
  // The lazy rescale (softmax.h) in every kernel: the consumers' registers hold it. At head dim 64
  // it spares the FMA pipe a step's 32 multiplies of O a thread (hdim 64 bf16 16k tokens, three
  // consumers; session 42, plain: causal 2.25 against 2.43 ms, non-causal 4.34 against 4.75, 1k
  // non-causal 0.350 against 0.383; two: causal 1k 0.253 against 0.262; session 43, score mods
  // with fill_alibi's FFMA: causal ALiBi 2.28 against 2.47, non-causal 4.43 against 4.66, 1k
  // non-causal 0.387 against 0.407, window (512, 512) 0.410 against 0.424; dropout, two consumers:
  // 3.37 against 3.44 causal, 6.89 against 6.97 non-causal).
  static constexpr bool kLazyRescale = true;
  static_assert(kHeadDim % 32 == 0 && kBlockN % 16 == 0);
  static constexpr int fma_exp2_every(bool softcap) { return fwd_sm90_fma_exp2_every(kHeadDim, kVariant, softcap); }
  // A step's exponentials run while its P V does (fwd_kernel_sm90_ws.h). Session 28 (16k tokens):
  // hdim 128 plain and softcap 2-4 % faster; hdim 64 plain causal 2 % and hdim 128 dropout
  // non-causal 8-10 % slower (its registers). Session 55 (H100): hdims 192 / 256 softcap 4-7 % and
  // plain 0-2 % faster; hdim 96 plain, windows and softcap's fixed offset with ALiBi 1-4 % faster,
  // but softcap's other split kernels (the fixed offset alone, the checked ones) 1-4 % slower, so
  // they keep it off; hdim 64's two-consumer score-mod kernels even (its three-consumer ones spill).
  static constexpr bool kOverlapPV =
      kVariant != Variant::kDropout &&
      (kHeadDim >= 128 || (kHeadDim == 96 && (kLoops == Sm90Loops::kPerTile || kLoops == Sm90Loops::kAlibiFixedOffset)));

  // One warpgroup MMA per consumer warpgroup, each on its own 64 rows; K and V are shared.
  using TileS = Shape<_64, Int<kBlockN>, Int<kHeadDim>>;  // (M, N, K) of one warpgroup's S = Q K^T
  using TileO = Shape<_64, Int<kHeadDim>, Int<kBlockN>>;  // (M, N, K) of one warpgroup's O = P V
  using ConsumerLayout = Layout<Shape<Int<kConsumers>, _1, _1>>;
  using TiledMmaS = decltype(make_tiled_mma(SM90::GMMA::ss_op_selector<Element, Element, ElementAccum, TileS>(),
                                            ConsumerLayout{}));
  using TiledMma = decltype(make_tiled_mma(
      SM90::GMMA::rs_op_selector<Element, Element, ElementAccum, TileO, SM90::GMMA::Major::K,
                                 SM90::GMMA::Major::MN>(),
      ConsumerLayout{}));  // O = P V; write_o reads its C layout

  using SmemLayoutQ = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  // (kBlockN, head_dim) of one buffer, (kBlockN, head_dim, stage) of all: the buffers follow
  // each other, whole numbers of swizzle atoms.
  using SmemLayoutKVStage = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{},
                                              Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  static_assert(cosize_v<SmemLayoutKV> == kStages * cosize_v<SmemLayoutKVStage>);
  // (head_dim, kBlockN, stage): V's bytes viewed transposed.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // Q's buffers, (kBlockM, head_dim, stage): two where they fit (fwd_sm90_ws_q_stages).
  static constexpr int kQStages = fwd_sm90_ws_q_stages(kTile, kHeadDim);
  using SmemLayoutQStages = decltype(tile_to_shape(GmmaSmemAtomK<Element, kHeadDim>{},
                                                   Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQStages>>{}));
  static_assert(cosize_v<SmemLayoutQStages> == kQStages * cosize_v<SmemLayoutQ>);
  using SmemLayoutO = SmemLayoutQ;  // in shared memory of its own where it fits, else in Q's
  static constexpr bool kSeparateO = fwd_sm90_ws_separate_o(kTile, kHeadDim);
  using SmemCopyAtomO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  static constexpr int kSmemQBytes = cosize_v<SmemLayoutQ> * sizeof(Element);
  static constexpr int kSmemKVBytes = cosize_v<SmemLayoutKV> * sizeof(Element);  // every stage
  static constexpr int kSmemOBytes = kSeparateO ? kSmemQBytes : 0;
  static constexpr int kSmemBytes = kQStages * kSmemQBytes + 2 * kSmemKVBytes + kSmemOBytes + kFwdSm90WsBarrierBytes;
  static_assert(kSmemBytes == fwd_sm90_ws_smem_bytes(kTile, kHeadDim));
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
  static_assert(kSmemQBytes % 1024 == 0 && kSmemKVBytes % (1024 * kStages) == 0, "swizzle atoms start 1024-byte aligned");

  using GmemTiledCopyQKV = typename GmemCopies<Element, kNProducerThreads, kHeadDim>::TiledCopyAsyncZfill;
  using GmemTiledCopyO = typename GmemCopies<Element, 128, kHeadDim>::TiledCopyStore;  // one consumer's rows
  static constexpr int kProducerRowsPerPass = kNProducerThreads / GmemCopies<Element, kNProducerThreads, kHeadDim>::kThreadsPerRow;
  static_assert(kBlockM % kProducerRowsPerPass == 0 && kBlockN % kProducerRowsPerPass == 0,
                "the producer's copies cover whole Q and K / V tiles");
};

}  // namespace flash_attn_cute
