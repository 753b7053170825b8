// The Hopper backward (sm_90a warpgroup MMAs), plain, score-mod (softcap, ALiBi, any window) and
// dropout variants, which calls take on compute capability 9.0 (dispatch.cpp, bwd_takes_sm90):
// every non-deterministic one, and the deterministic ones of bwd_sm90_deterministic (kernels of
// their own, Is_det).
// One CTA per (key block of kBlockN = 128 keys, batch, KV head), two warpgroups of 64 keys each
// (past head dim 128: 64 keys, the warpgroups splitting head_dim, bwd_sm90_block_n);
// K and V stay in shared memory, dK and dV in registers, while the CTA walks the query row blocks
// (kBlockM rows: 128 up to head dim 64, 64 above) of every query head of its KV head's group:
//   S^T = K Q^T, dP^T = V dO^T          (warpgroup MMAs from shared memory: rows are keys)
//   P^T = exp2(S^T * scale log2(e) - LSE log2(e)),  dS^T = P^T * (dP^T - D)   (LSE, D per column)
//   dV += P^T dO, dK += dS^T Q          (P^T and dS^T straight from the registers; dO, Q MN-major)
//   dQ += dS K                          (dS^T through shared memory; the warpgroups split the rows
//                                        of 128, else head_dim at 64 and 128, the keys at 32 and 96)
// dQ goes into the fp32 accumulator in fragment order, as the SM80 backward's (DqAccumulator and
// bwd_convert_dq_fragments_kernel, bwd_epilogue.h, serve both): each thread stores its fragment
// into a shared-memory image of the tile, and after the next CTA barrier one thread adds the whole
// tile with one bulk reduction. Measured on H200 (bf16, hdim 128, 16k tokens, non-causal): 436 TFLOP/s,
// against 422 with fragment-order atomics from every thread and 359 with atomics in the MMA
// layout's rows (likely cause, not profiled: reductions still in flight at the next proxy fence,
// whose MEMBAR waits for them). Computing P^T while dP^T's MMAs run, with dV's MMAs issued before
// dS^T, was 3.5 % slower.
// Q, dO, LSE and D are double-buffered, the next row block's loads issued while the step's first
// MMAs run: Q and dO by TMA where they fit (bwd_sm90_tma.h: thread 0 issues both copies), else, as
// LSE and D always, by cp.async as in the SM80 backward (bwd_kernel.h). The masked row blocks
// (causal diagonal, left window edge, ragged last key block) run a loop body of their own, so that
// the others test no key or row.
// Dropout's mask follows a queries-by-keys accumulator's lanes (dropout.h), so the dropout variant
// computes S = Q K^T and dP = dO V^T with queries as rows, applies the SM80 backward's score
// transforms to them, and takes P^T and dS^T to dV and dK through shared memory (bwd_step_rows).
// Past head dim 128 every variant takes that step: with 64 keys a CTA, the key-rows MMAs would give
// one warpgroup all of S^T and dP^T, and dV's and dK's head_dim halves each need all of P^T and dS^T.
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "block_info.h"
#include "bwd_api.h"
#include "bwd_epilogue.h"
#include "bwd_sm90_tma.h"
#include "dropout.h"
#include "kernel_traits.h"
#include "kernel_traits_sm90.h"
#include "mask.h"
#include "params.h"
#include "row_walk.h"
#include "softmax.h"
#include "utils.h"
#include "wgmma.h"

namespace flash_attn_cute {

using namespace cute;

// One bulk reduction (sm_90, PTX ISA 8.0): adds `bytes` of fp32 from shared to global memory, the
// additions done by the memory system; bulk_commit closes this thread's reductions into a group,
// bulk_wait_read waits until its groups have read their shared memory, bulk_wait until they are done.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, float const* smem, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gmem),
               "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Query rows per step: 128 in the plain and dropout kernels at head dims 32 and 64, where dK and dV take
// only 64 registers (S^T and dP^T then take 64 each), 64 elsewhere. Measured on H200 (bf16, hdim
// 64, 16k tokens, plain): 128 rows 406-409 TFLOP/s non-causal and 365-369 causal, against 375 and
// 348-350 with 64 (likely, not profiled: the S^T and dP^T MMAs' N of 128 reads fewer shared-memory
// bytes per FLOP; 4-44 bytes of spills). The score-mod kernel's four copies of its score loop took
// a 928-byte stack frame with 128 rows (session 43: forward + backward 6.6 times the plain one's);
// split by softcap (Sm90BwdCap), its kernel without softcap takes 128 (two copies of the score loop:
// a 72-byte frame, 84 bytes of spill stores), and so does softcap's without ALiBi (one copy: 72 / 84
// bytes, sm_90a, session 49); softcap's with ALiBi too: at head dim 32 since session 61 (H100: backward
// 1.18-1.24x faster than at 64; 24-48-byte frames), at 64 since session 71 (H100, bf16: 1.11x causal,
// 1.20x non-causal; causal a 40-byte frame, 36 / 100 bytes, where session 49's kernel spilled 96-132). The
// dropout kernel is split by softcap too (session 49): without softcap's code in it, its 128-row
// step spills 152 / 244 bytes (stores / loads; 74 local-memory accesses a step) against 512 / 792
// (272). Its softcap kernel kept 128 rows until the TMA loads (session 46, cp.async: at 64 rows,
// spilling none, forward + backward 0.73 -> 0.71 of plain); with them it takes 64 at head dim 64
// (session 60, H100, backward 0-7 % faster; 128 rows: 340 / 692 bytes of spill stores / loads),
// 128 at 32 (64 rows 9-14 % slower there, as the dropout kernel without softcap is at 32 and 64:
// 11-18 % and 0-6 %).
enum class Sm90BwdCap {
  kNone,     // no softcap: ALiBi and windows at run time (the score-mod kernel's score loop twice: with
             // and without ALiBi)
  kCap,      // softcap (the dropout kernel's: ALiBi at run time), the score-mod kernel's without ALiBi
  kCapAlibi  // the score-mod kernel's softcap with ALiBi
};
constexpr int bwd_sm90_block_m(int head_dim, Variant variant, Sm90BwdCap cap = Sm90BwdCap::kNone) {
  const bool rows_64 = head_dim > 32 && variant == Variant::kDropout && cap == Sm90BwdCap::kCap;
  return head_dim <= 64 && !rows_64 ? 128 : 64;
}

// Keys per CTA: 128 up to head dim 128, 64 per warpgroup, each holding dK and dV of its own keys.
// Past 128, dK and dV of 64 keys take both warpgroups' registers (128 each at head dim 256), so
// the CTA takes 64 keys and the warpgroups split head_dim in dK, dV and dQ (kSplitHeadDim); such
// kernels take every step with queries as rows (bwd_step_rows), each warpgroup computing S and dP
// for 32 of the keys, and P^T and dS^T go to dV and dK through shared memory.
constexpr int bwd_sm90_block_n(int head_dim) { return head_dim <= 128 ? 128 : 64; }

// Thread 0's dQ state in the deterministic kernels (Is_det), in shared memory after the rest: not
// in registers, which the 128-key kernels have none to spare of across a step (ptxas: 8-36 bytes
// more spilled at head dim 128).
struct DqStaged {
  DqHandOn hand_on;   // the order's (DqAccumulator, bwd_epilogue.h)
  float* tile;        // the tile whose image sdQ holds, not yet added (nullptr: none)
  float* step_tile;   // the step's tile and its row block's counter, noted at its start
  int* step_turn;
  int key_block;      // the CTA's, whose turn thread 0 waits for
};

template <int kHeadDim_, typename Element_, int kBlockM_ = bwd_sm90_block_m(kHeadDim_, Variant::kPlain)>
struct BwdKernelTraitsSm90 {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = bwd_sm90_block_n(kHeadDim);  // keys per CTA
  static constexpr bool kSplitHeadDim = kBlockN == 64;
  static constexpr int kNThreads = 256;
  static constexpr int kNWarps = kNThreads / 32;
  static_assert(kHeadDim % 32 == 0, "64- or 128-byte swizzled rows (GmmaSmemAtomK)");
  // The swizzle of Q, dO, K and V: their MN-major reads (dO^T, Q^T, K^T) start each warpgroup's half
  // of head_dim at a swizzle atom where kSplitHeadDim (at 192, 96 columns: 64-byte atoms).
  static constexpr int kSwizzleCols = kSplitHeadDim ? kHeadDim / 2 : kHeadDim;

  // The warpgroups split the keys (M); where kSplitHeadDim, one warpgroup's worth of keys (the
  // key-rows MMAs below are then not used).
  using KeysLayout = Layout<Shape<Int<kBlockN / 64>, _1, _1>>;
  // S^T = K Q^T and dP^T = V dO^T: (M, N, K) = (keys, queries, head_dim) of one warpgroup.
  using TiledMmaSdP = decltype(make_tiled_mma(
      SM90::GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(), KeysLayout{}));
  // dV += P^T dO and dK += dS^T Q: (keys, head_dim, queries), B read MN-major; A from registers
  // (bwd_step), or read MN-major from shared memory (bwd_step_rows: TiledMmadKVSmem), which is the
  // one form where kSplitHeadDim (its warpgroups then split head_dim, N).
  static constexpr int kDkvSplit = kSplitHeadDim ? 2 : 1;
  using DkvAtomShape = Shape<_64, Int<kHeadDim / kDkvSplit>, Int<kBlockM>>;
  using DkvLayout = Layout<Shape<Int<kBlockN / 64>, Int<kDkvSplit>, _1>>;
  using TiledMmadKVSmem = decltype(make_tiled_mma(
      SM90::GMMA::ss_op_selector<Element, Element, float, DkvAtomShape, SM90::GMMA::Major::MN, SM90::GMMA::Major::MN>(),
      DkvLayout{}));
  using TiledMmadKV = std::conditional_t<
      kSplitHeadDim, TiledMmadKVSmem,
      decltype(make_tiled_mma(SM90::GMMA::rs_op_selector<Element, Element, float, DkvAtomShape, SM90::GMMA::Major::K,
                                                         SM90::GMMA::Major::MN>(),
                              DkvLayout{}))>;
  // dQ = dS K: (queries, head_dim, keys); A and B read MN-major. The warpgroups split the queries (M)
  // where there are 128, else head_dim (N). At head dims 32 and 96, whose halves would start inside
  // K's 32-column swizzle atoms, they split the keys (kDqSplitK): each warpgroup's MMA (128 threads,
  // tidx % 128) sums its own 64 keys over the whole tile, and the two partial tiles add up in shared
  // memory (stage_dq).
  static constexpr bool kDqSplitM = kBlockM == 128;
  static constexpr bool kDqSplitK = !kDqSplitM && kHeadDim % 64 != 0;
  using DqLayout = std::conditional_t<kDqSplitM, Layout<Shape<_2, _1, _1>>,
                                      std::conditional_t<kDqSplitK, Layout<Shape<_1, _1, _1>>,  // one warpgroup
                                                         Layout<Shape<_1, _2, _1>>>>;
  using DqAtomShape = Shape<Int<kDqSplitM ? 64 : kBlockM>, Int<kDqSplitM || kDqSplitK ? kHeadDim : kHeadDim / 2>,
                            Int<kDqSplitK ? kBlockN / 2 : kBlockN>>;
  using TiledMmadQ = decltype(make_tiled_mma(
      SM90::GMMA::ss_op_selector<Element, Element, float, DqAtomShape, SM90::GMMA::Major::MN, SM90::GMMA::Major::MN>(),
      DqLayout{}));

  // Q and dO: (kBlockM, kHeadDim, slot); K, V: (kBlockN, kHeadDim); dS^T: (kBlockN, kBlockM), its
  // rows keys. The transposed views: (kHeadDim, kBlockM, slot) of Q and dO, (kHeadDim, kBlockN) of
  // K, and (kBlockM, kBlockN) of dS^T.
  using SmemLayoutQ = decltype(tile_to_shape(GmmaSmemAtomK<Element, kSwizzleCols>{}, Shape<Int<kBlockM>, Int<kHeadDim>, _2>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));
  using SmemLayoutKV = decltype(tile_to_shape(GmmaSmemAtomK<Element, kSwizzleCols>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutdSt = decltype(tile_to_shape(GmmaSmemAtomK<Element, kBlockM>{}, Shape<Int<kBlockN>, Int<kBlockM>>{}));
  using SmemLayoutdS = decltype(composition(SmemLayoutdSt{}, make_layout(Shape<Int<kBlockM>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemCopyAtomdS = Copy_Atom<SM90_U32x4_STSM_N, Element>;  // stmatrix: 8x8 blocks of 16-bit pairs

  static constexpr int kSmemQElems = cosize_v<SmemLayoutQ>;  // both slots
  static constexpr int kSmemKVElems = cosize_v<SmemLayoutKV>;
  static constexpr int kSmemdSElems = cosize_v<SmemLayoutdSt>;
  // Q x 2, dO x 2, K, V, dS^T, then the fp32 LSE (log2 units) and D of each slot.
  static constexpr int kSmemLseDOffset = (2 * kSmemQElems + 2 * kSmemKVElems + kSmemdSElems) * int(sizeof(Element));
  // Then dQ's tile image, fp32 in fragment order (DqAccum), 128-byte aligned for the bulk reduction,
  // where it fits beside the rest (kDqViaSmem): not at head dim 256, whose CTAs add their dQ
  // fragments to the accumulator with atomics, as the SM80 backward does.
  static constexpr int kSmemdQOffset = (kSmemLseDOffset + 2 * 2 * kBlockM * int(sizeof(float)) + 127) / 128 * 128;
  static constexpr int kDqTileBytes = kBlockM * kHeadDim * int(sizeof(float));
  static constexpr int kPBytes = kSmemdSElems * int(sizeof(Element));  // bwd_step_rows' P, below
  static constexpr bool kDqViaSmem =
      (kSmemdQOffset + kDqTileBytes + 1023) / 1024 * 1024 + (kSplitHeadDim ? kPBytes : 0) <= 227 * 1024;
  static_assert(kDqViaSmem || kSplitHeadDim);
  static constexpr int kSmemBytes = kSmemdQOffset + (kDqViaSmem ? kDqTileBytes : 0);

  // The dropout variant's and kSplitHeadDim's step (bwd_step_rows): S = Q K^T and dP = dO V^T with
  // queries as rows, (queries, keys, head_dim), the warpgroups split the keys (N). P and dS go to
  // shared memory as (queries, keys) with keys contiguous, so that the accumulator's pairs of
  // adjacent keys store as 32-bit words: dS in dS^T's buffer, P in one of its own after the rest
  // (1024-byte aligned for the MMAs' swizzle). dV += P^T dO and dK += dS^T Q read them transposed
  // (A MN-major), dQ = dS K as is (A K-major; its C layout, which the dQ tile's fragment order
  // follows, is TiledMmadQ's).
  using TiledMmaSdPRows = decltype(make_tiled_mma(
      SM90::GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN / 2>, Int<kHeadDim>>>(),
      Layout<Shape<_1, _2, _1>>{}));
  using TiledMmadQRows = decltype(make_tiled_mma(
      SM90::GMMA::ss_op_selector<Element, Element, float, DqAtomShape, SM90::GMMA::Major::K, SM90::GMMA::Major::MN>(),
      DqLayout{}));
  using SmemLayoutPdSRows = decltype(tile_to_shape(GmmaSmemAtomK<Element, kBlockN>{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using SmemLayoutPdSRowsT = decltype(composition(SmemLayoutPdSRows{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));
  static_assert(cosize_v<SmemLayoutPdSRows> == cosize_v<SmemLayoutdSt>);
  static constexpr int kSmemPOffset = (kSmemBytes + 1023) / 1024 * 1024;
  static constexpr int kSmemBytesRows = kSmemPOffset + kPBytes;
  static_assert(kSmemBytesRows <= 227 * 1024);
  // Whether a kernel of this variant takes bwd_step_rows, and so kSmemBytesRows of shared memory.
  static constexpr bool rows_step(Variant variant) { return variant == Variant::kDropout || kSplitHeadDim; }
  // Then the barriers of Q's and dO's buffers (bwd_sm90_tma.h: used where TMA loads them).
  using QRing = SmemRing<2>;
  static constexpr int q_ring_offset(Variant variant) {
    return ((rows_step(variant) ? kSmemBytesRows : kSmemBytes) + 15) / 16 * 16;
  }
  static constexpr int smem_bytes(Variant variant) { return q_ring_offset(variant) + int(sizeof(QRing)); }
  // The deterministic kernels' DqStaged, after the rest.
  static constexpr int dq_staged_offset(Variant variant) { return (smem_bytes(variant) + 15) / 16 * 16; }
  static constexpr int smem_bytes_det(Variant variant) { return dq_staged_offset(variant) + int(sizeof(DqStaged)); }
  static_assert(smem_bytes_det(Variant::kDropout) <= 227 * 1024 && smem_bytes_det(Variant::kPlain) <= 227 * 1024);

  using GmemTiledCopy = typename GmemCopies<Element, kNThreads, kHeadDim>::TiledCopyAsync;
  using GmemTiledCopyOut = typename GmemCopies<Element, kNThreads, kHeadDim>::TiledCopyStore;
  using SmemCopyAtomOut = Copy_Atom<SM90_U32x4_STSM_N, Element>;
  // dQ's tiles in the accumulator: kBlockM rows of one row block, which the accumulator's padding
  // (bwd_api.cpp: whole SM80 row blocks per sequence) holds whole.
  static constexpr int kDqThreads = kDqSplitK ? 128 : kNThreads;  // the dQ MMA's, whose fragment order the tiles take
  // Groups of 4 where the fragments go out by atomics (16-byte reductions), else pairs.
  static constexpr int kDqVec = kDqViaSmem ? 2 : 4;
  using DqAccum = DqAccumulator<kBlockM, kHeadDim, kDqThreads / 32, kDqVec>;
  static_assert(bwd_tile_shape(kHeadDim).block_m % kBlockM == 0, "the accumulator's row blocks hold whole tiles");
  static_assert(kBlockM % kDqSemaphoreRowBlock == 0, "the dQ counters (bwd_api.cpp) hold this row block's");
  static_assert(dq_accum_row_floats(kHeadDim) == kHeadDim, "a tile's rows are contiguous");
};

// kCap: the score-mod variant's calls with softcap, kernels of their own (bwd_sm90_block_m).
// Is_det: deterministic (bwd_sm90_deterministic).
template <class Traits, bool Is_causal, bool Is_even_K, Variant kVariant, Sm90BwdCap kCap, bool Is_det>
__device__ __forceinline__ void bwd_sm90_col_block(BwdParams const& params, BwdSm90Tma<Traits> const& tma, char* smem,
                                                   int n_block, int bidb, int bidh_kv) {
  constexpr bool Is_dropout = kVariant == Variant::kDropout;
  constexpr bool Has_mods = kVariant != Variant::kPlain;  // dropout calls may carry score mods too
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  const int tidx = threadIdx.x;
  const Window window = params.kernel_window<Has_mods, Is_causal>();
  const BlockInfo binfo(params, bidb);
  if (n_block * kBlockN >= binfo.seqlen_k) return;
  const MBlockRange range = bwd_m_block_range(n_block, kBlockM, kBlockN, binfo.seqlen_q, binfo.seqlen_k, window);
  const index_t n_start = index_t(n_block) * kBlockN;
  const int keys_left = binfo.seqlen_k - int(n_start);
  auto sync = [] { __syncthreads(); };
  static_assert(!Is_det || (kVariant == Variant::kPlain && Traits::kDqViaSmem), "bwd_sm90_deterministic");

  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_do = smem_q + Traits::kSmemQElems;
  Element* smem_k = smem_do + Traits::kSmemQElems;
  Element* smem_v = smem_k + Traits::kSmemKVElems;
  Element* smem_ds = smem_v + Traits::kSmemKVElems;
  float* sLseD = reinterpret_cast<float*>(smem + Traits::kSmemLseDOffset);  // (slot, LSE / D, kBlockM)
  float* sdQ = reinterpret_cast<float*>(smem + Traits::kSmemdQOffset);        // a dQ tile, fragment order
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});     // (kBlockM, kHeadDim, slot)
  Tensor sdO = make_tensor(make_smem_ptr(smem_do), typename Traits::SmemLayoutQ{});   // (kBlockM, kHeadDim, slot)
  Tensor sQt = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQt{});   // (kHeadDim, kBlockM, slot)
  Tensor sdOt = make_tensor(make_smem_ptr(smem_do), typename Traits::SmemLayoutQt{}); // (kHeadDim, kBlockM, slot)
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});    // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutKV{});    // (kBlockN, kHeadDim)
  Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKt{});   // (kHeadDim, kBlockN)
  Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutdSt{}); // (kBlockN, kBlockM)
  Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutdS{});   // (kBlockM, kBlockN)

  // Global -> shared (rows past seqlen and columns past head_dim as zeros).
  typename Traits::GmemTiledCopy gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tidx);
  Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  auto load_rows = [&](TensorView const& view, auto& smem_tile, int bidh, int m_block, int slot) {
    const int rows_left = binfo.seqlen_q - m_block * kBlockM;
    Tensor g = gmem_row_tile<kBlockM, kHeadDim>(binfo.q_head<Element>(view, bidb, bidh), view.row_stride,
                                                index_t(m_block) * kBlockM);
    copy_or_zero<true, !Is_even_K>(gmem_tiled_copy, gmem_thr_copy.partition_S(g),
                                   gmem_thr_copy.partition_D(smem_tile(_, _, slot)), tQcQ, rows_left, params.head_dim);
  };
  // Q's and dO's buffers' barriers, where TMA loads them: use u of the buffers (the u-th row block
  // the CTA walks, 0, 1, ...) takes slot u % 2.
  auto& q_ring = *reinterpret_cast<typename Traits::QRing*>(smem + Traits::q_ring_offset(kVariant));
  // The row block's LSE, D, Q and dO into `use`'s slot.
  auto load_step = [&](int bidh, int m_block, int use) {
    const int slot = use % 2;
    const int rows_left = binfo.seqlen_q - m_block * kBlockM;
    // LSE and D; rows past seqlen_q get LSE +inf and D 0, so that their P and dS are 0.
    if (tidx < 2 * kBlockM && tidx % kBlockM < rows_left) {
      const index_t at = binfo.lse_offset(params, bidb, bidh) + index_t(m_block) * kBlockM + tidx % kBlockM;
      SM80_CP_ASYNC_CACHEALWAYS<float>::copy(tidx < kBlockM ? params.softmax_lse_ptr[at] : params.dsoftmax_sum_ptr[at],
                                             sLseD[slot * 2 * kBlockM + tidx]);
    } else if (tidx < 2 * kBlockM) {
      sLseD[slot * 2 * kBlockM + tidx] = tidx < kBlockM ? INFINITY : 0.f;
    }
    if (params.sm90_tma) {
      if (tidx == 0) tma.load(params, q_ring, use, smem_q, smem_do, m_block, bidh, bidb, binfo.q_row_start);
    } else {
      load_rows(params.q, sQ, bidh, m_block, slot);
      load_rows(params.dout, sdO, bidh, m_block, slot);
    }
    cp_async_fence();
  };

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  // The dQ MMA's thread, and its keys: all, or this warpgroup's half (kDqSplitK).
  const int dq_thread = Traits::kDqSplitK ? tidx % 128 : tidx;
  auto dq_keys = [&](auto const& t) {  // (rows, keys) -> (rows, the dQ MMA's keys)
    if constexpr (Traits::kDqSplitK) {
      return local_tile(t, make_shape(size<0>(t), size<2>(typename Traits::DqAtomShape{})), make_coord(0, tidx / 128));
    } else {
      return t;
    }
  };
  auto thr_sdp = mma_sdp.get_thread_slice(tidx);
  auto thr_dkv = mma_dkv.get_thread_slice(tidx);
  auto thr_dq = mma_dq.get_thread_slice(dq_thread);
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);     // (MMA, MMA_M, MMA_K)
  Tensor tdPrV = thr_sdp.partition_fragment_A(sV);    // (MMA, MMA_M, MMA_K)
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);     // (MMA, MMA_N, MMA_K, slot)
  Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);  // (MMA, MMA_N, MMA_K, slot)
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);  // (MMA, MMA_N, MMA_K, slot)
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);    // (MMA, MMA_N, MMA_K, slot)
  Tensor tdQrdS = thr_dq.partition_fragment_A(dq_keys(sdS));  // (MMA, MMA_M, MMA_K)
  Tensor tdQrKt = thr_dq.partition_fragment_B(dq_keys(sKt));  // (MMA, MMA_N, MMA_K)
  auto tile_nm = Shape<Int<kBlockN>, Int<kBlockM>>{};
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(tile_nm));  // (MMA, MMA_M, MMA_N) -> (key, query)
  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
  clear(acc_dk);
  clear(acc_dv);
  auto copy_ds = make_tiled_copy_C(typename Traits::SmemCopyAtomdS{}, mma_sdp);
  Tensor tdSsdS = copy_ds.get_thread_slice(tidx).partition_D(sdSt);  // (CPY, CPY_M, CPY_N)

  // The dropout variant's operands (bwd_step_rows): Q and dO as A, K and V as B; P (in the dropout
  // variant's extra shared memory) and dS transposed as dV's and dK's A, dS as dQ's; the scores'
  // (query, key) coordinates.
  typename Traits::TiledMmaSdPRows mma_sdp_rows;
  typename Traits::TiledMmadKVSmem mma_dkv_smem;
  typename Traits::TiledMmadQRows mma_dq_rows;
  auto thr_sdp_rows = mma_sdp_rows.get_thread_slice(tidx);
  auto thr_dkv_smem = mma_dkv_smem.get_thread_slice(tidx);
  auto thr_dq_rows = mma_dq_rows.get_thread_slice(dq_thread);
  Element* smem_p = reinterpret_cast<Element*>(smem + Traits::kSmemPOffset);
  Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdSRows{});    // (kBlockM, kBlockN)
  Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdSRowsT{});  // (kBlockN, kBlockM)
  Tensor sdSr = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdSRows{});    // (kBlockM, kBlockN)
  Tensor sdSrt = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdSRowsT{});  // (kBlockN, kBlockM)
  Tensor tSrQr = thr_sdp_rows.partition_fragment_A(sQ);    // (MMA, MMA_M, MMA_K, slot)
  Tensor tdPrdOr = thr_sdp_rows.partition_fragment_A(sdO); // (MMA, MMA_M, MMA_K, slot)
  Tensor tSrKr = thr_sdp_rows.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_K)
  Tensor tdPrVr = thr_sdp_rows.partition_fragment_B(sV);   // (MMA, MMA_N, MMA_K)
  Tensor tdVsPt = thr_dkv_smem.partition_fragment_A(sPt);    // (MMA, MMA_M, MMA_K)
  Tensor tdKsdSt = thr_dkv_smem.partition_fragment_A(sdSrt); // (MMA, MMA_M, MMA_K)
  Tensor tdQsdS = thr_dq_rows.partition_fragment_A(dq_keys(sdSr));  // (MMA, MMA_M, MMA_K)
  Tensor tdQsKt = thr_dq_rows.partition_fragment_B(dq_keys(sKt));   // (MMA, MMA_N, MMA_K)
  auto tile_mn = Shape<Int<kBlockM>, Int<kBlockN>>{};
  Tensor tScSr = thr_sdp_rows.partition_C(make_identity_tensor(tile_mn));  // (MMA, MMA_M, MMA_N) -> (query, key)
  Tensor tScSr_rc = make_tensor(tScSr.data(), acc_layout_rowcol(tScSr.layout()));         // (rows, cols)
  Tensor tScSr_blocks = make_tensor(tScSr.data(), acc_layout_mma_blocks(tScSr.layout())); // ((2, 2), MMA_M, N / 8)
  constexpr int kRowsPerThread = decltype(size<0>(tScSr_rc))::value;
  auto copy_pds_rows = make_tiled_copy_C(typename Traits::SmemCopyAtomdS{}, mma_sdp_rows);
  Tensor tPsP = copy_pds_rows.get_thread_slice(tidx).partition_D(sP);    // (CPY, CPY_M, CPY_N)
  Tensor tPsdS = copy_pds_rows.get_thread_slice(tidx).partition_D(sdSr); // (CPY, CPY_M, CPY_N)
  [[maybe_unused]] DropoutRng dropout_rng(0, 0, 0);
  if constexpr (Is_dropout) dropout_rng = make_dropout_rng(params.dropout);

  // The accumulator tile whose image sdQ holds, not yet added (nullptr: none). After a CTA barrier
  // that follows every thread's stores and proxy fence, thread 0 adds it.
  float* dq_pending = nullptr;
  auto add_pending_dq = [&] {
    if (tidx == 0 && dq_pending != nullptr) {
      bulk_reduce_add_f32(dq_pending, sdQ, Traits::kDqTileBytes);
      bulk_commit();
    }
  };

  // Deterministic: the SM80 backward's order of each row block's dQ tiles (block_info.h; its walk
  // below), its hand-on state (DqAccumulator) thread 0's, in shared memory. Thread 0 adds the tile
  // whose image sdQ holds by one bulk reduction, after the CTA barrier that follows every thread's
  // stores and proxy fence, once the row block's counter names this key block: at the start of the
  // next step if it does by then, else at the last barrier before sdQ is stored again
  // (dq_tile_free), where it waits for it. The turn goes on at the start of the step after, once the
  // reduction is done (cp.async.bulk.wait_group, not its .read form), after that step's first MMAs
  // are issued, so that thread 0's waits (the reduction's, the release's) run under them rather than
  // hold back its warpgroup's MMAs or the CTA at a barrier.
  [[maybe_unused]] const int n_count = ceil_div(binfo.seqlen_k, kBlockN);
  [[maybe_unused]] const bool rotated =
      Is_det && dq_rotated(params.dq_rotate, window, n_count, ceil_div(binfo.seqlen_q, kBlockM));
  DqStaged* dq_staged = reinterpret_cast<DqStaged*>(smem + Traits::dq_staged_offset(kVariant));
  typename Traits::DqAccum dq_accum{&dq_staged->hand_on};
  if constexpr (Is_det) {
    dq_accum.init(dq_next_key_block(n_block, n_count, rotated));
    if (tidx == 0) {
      dq_staged->tile = nullptr;
      dq_staged->key_block = n_block;
    }
  }
  // Row block m_start / kBlockM's tile of head bidh in the dQ accumulator.
  auto dq_accum_tile = [&](int bidh, int m_start) {
    return params.dq_accum_ptr + binfo.dq_accum_offset(params, bidb, bidh) + index_t(m_start) * params.dq_accum_row_stride;
  };
  // At the step's start, before its MMAs are issued: where its tile goes (the 64-bit arithmetic done
  // where the fewest registers are live).
  auto note_step_dq = [&](int bidh, int m_block) {
    if (tidx == 0) {
      dq_staged->step_tile = dq_accum_tile(bidh, m_block * kBlockM);
      dq_staged->step_turn = dq_semaphore_at(params, bidb, bidh, m_block, kBlockM);
    }
  };
  // Thread 0. may_wait false: only if the turn has come.
  auto add_staged_dq = [&](bool may_wait) {
    float* const tile = dq_staged->tile;
    if (tile == nullptr) return;
    int* const turn = dq_accum.hand_on->turn;
    int seen = load_acquire(turn);
    const int key_block = dq_staged->key_block;
    if (!may_wait && seen != key_block) return;
    while (seen != key_block) seen = load_acquire(turn);
    dq_accum.hand_on->pending = turn;
    bulk_reduce_add_f32(tile, sdQ, Traits::kDqTileBytes);
    bulk_commit();
    dq_staged->tile = nullptr;
  };
  // Thread 0, after a CTA barrier: the turn of the tile added last goes on.
  auto hand_on_added_dq = [&] {
    if (dq_accum.hand_on->pending == nullptr) return;
    bulk_wait();
    store_release(dq_accum.hand_on->pending, dq_accum.hand_on->next);
    dq_accum.hand_on->pending = nullptr;
  };
  // After the step's first MMAs are issued.
  auto dq_step_start = [&] {
    if (tidx == 0) {
      hand_on_added_dq();
      add_staged_dq(false);
    }
  };
  // Before the barrier after which the step stores its dQ tile.
  auto dq_tile_free = [&] {
    if (tidx == 0) {
      if constexpr (Is_det) add_staged_dq(true);
      bulk_wait_read();  // sdQ has been read
    }
  };

  const FwdMask mask{binfo.seqlen_q, binfo.seqlen_k, window};
  [[maybe_unused]] const bool has_alibi = Has_mods && params.alibi_slopes != nullptr;
  [[maybe_unused]] const bool alibi_causal = alibi_causal_form(window);

  // Stores a dQ tile's fragment into sdQ (the whole tile: rows past seqlen_q and columns past
  // head_dim add 0, as P = 0 and K's columns are zeros there) for the next step's add_pending_dq.
  // Split by keys, warpgroup 0 stores its partial tile and warpgroup 1 adds its own to it.
  // Without kDqViaSmem, the fragment goes straight into the accumulator tile (DqAccumulator's atomics).
  auto stage_dq = [&](auto const& acc_dq, int bidh, int m_start) {
    if constexpr (!Traits::kDqViaSmem) {
      Traits::DqAccum::add_fragment(acc_dq, dq_accum_tile(bidh, m_start), dq_thread);
      return;
    }
    constexpr int kDqSumBarrier = 1;
    auto pair = [&](int i) { return reinterpret_cast<float2*>(Traits::DqAccum::fragment_group(sdQ, i, dq_thread)); };
    if (Traits::kDqSplitK && tidx >= 128) {
      named_barrier_sync(kDqSumBarrier, 256);  // warpgroup 0's stores are done
#pragma unroll
      for (int i = 0; i < size(acc_dq); i += 2) {
        const float2 other = *pair(i);
        *pair(i) = make_float2(acc_dq(i) + other.x, acc_dq(i + 1) + other.y);
      }
    } else {
#pragma unroll
      for (int i = 0; i < size(acc_dq); i += 2) *pair(i) = make_float2(acc_dq(i), acc_dq(i + 1));
      if (Traits::kDqSplitK) named_barrier_arrive(kDqSumBarrier, 256);
    }
    if constexpr (Is_det) {
      if (tidx == 0) {
        dq_staged->tile = dq_staged->step_tile;
        dq_accum.hand_on->turn = dq_staged->step_turn;
      }
    } else {
      dq_pending = dq_accum_tile(bidh, m_start);
    }
  };

  // A step's start: `use`'s loads have landed and every thread is done with the other slot (and dS,
  // P); then the previous step's dQ tile is added (deterministic: the step's own tile is noted).
  auto begin_step = [&](int use, int bidh, int m_block) {
    if (params.sm90_tma) {
      q_ring.wait(use, false);
      // Varlen: the box's rows past the sequence's end are the next sequence's (bwd_sm90_tma.h). Their
      // P and dS are 0 (LSE +inf, D 0), but 0 times a non-finite value is not: zeros, as cp.async
      // leaves them (the fence below hands these writes to the MMAs' async proxy).
      const int rows_left = binfo.seqlen_q - m_block * kBlockM;
      if (binfo.is_varlen && rows_left < kBlockM) {
        zero_rows_from(sQ(_, _, use % 2), rows_left, tidx, Traits::kNThreads);
        zero_rows_from(sdO(_, _, use % 2), rows_left, tidx, Traits::kNThreads);
      }
    }
    wait_copies_and_sync();
    if constexpr (Is_det) {
      note_step_dq(bidh, m_block);
    } else {
      add_pending_dq();  // the barrier above follows its stores and fence
    }
  };

  // One query row block of head bidh; its Q, dO, LSE and D are in flight into `use`'s slot.
  auto bwd_step = [&](int bidh, int m_block, int use, auto is_masked, bool has_next, int next_bidh, int next_m_block) {
    constexpr bool kMasked = decltype(is_masked)::value;
    const int m_start = m_block * kBlockM;
    const int slot = use % 2;
    [[maybe_unused]] const float alibi_slope = Has_mods ? params.alibi_slope_scaled(bidb, bidh) : 0.f;
    begin_step(use, bidh, m_block);
    Tensor tSrS = partition_fragment_C(mma_sdp, tile_nm);   // (MMA, MMA_M, MMA_N)
    Tensor tdPrdP = partition_fragment_C(mma_sdp, tile_nm); // (MMA, MMA_M, MMA_N)
    wgmma_issue<true>(mma_sdp, tSrK, tSrQ(_, _, _, slot), tSrS);
    wgmma_issue<true>(mma_sdp, tdPrV, tdPrdO(_, _, _, slot), tdPrdP);
    if constexpr (Is_det) dq_step_start();
    // The next row block's copies are issued while the MMAs run: with cp.async their address
    // arithmetic (hundreds of instructions a thread) would otherwise hold back the step's first MMA.
    if (has_next) load_step(next_bidh, next_m_block, use + 1);
    warpgroup_mma_done(tSrS, tdPrdP);
    float const* lse = sLseD + slot * 2 * kBlockM;
    float const* dsum = lse + kBlockM;
    // P and dS from S and dP, with the call's score mods (with_softcap, with_alibi: compile-time, one
    // copy of the loop per case; checked per score, ptxas predicates them and every score issues both;
    // with softcap, both are the kernel's: kCap). ALiBi (alibi_at): in a causal kernel, where every key a
    // row sees lies left of its diagonal, either form takes an FFMA a score and its row's part goes
    // into the row's LSE term (row_part); in the others the symmetric form an add and an FFMA.
    [[maybe_unused]] const AlibiBiasAt<0, decltype(tScS)> alibi_at(tScS, m_start, int(n_start), binfo.seqlen_q,
                                                                   binfo.seqlen_k);
    [[maybe_unused]] const auto alibi_row = alibi_at.row_part(alibi_slope, alibi_causal, params.softmax_scale_log2);
    auto scores = [&](auto with_softcap, auto with_alibi) __attribute__((always_inline)) {
      constexpr bool kAlibi = decltype(with_alibi)::value;
#pragma unroll
      for (int i = 0; i < size(tSrS); ++i) {
        const int key = get<0>(tScS(i)), row = get<1>(tScS(i));
        const int col = int(n_start) + key;
        // The score as the forward's softmax saw it (params.h): through the cap, plus ALiBi's bias;
        // the cap's derivative 1 - tanh^2 goes into dS (score_scale, the rest, is ds_scale()'s).
        float s = tSrS(i), dcap = 1.f;
        if constexpr (decltype(with_softcap)::value) {
          s = fast_tanh(s * params.softcap);
          dcap = 1.f - s * s;
        }
        float lse_term = lse[row] * float(M_LOG2E);  // the row's, in log2 units (less ALiBi's row part)
        if constexpr (kAlibi && Is_causal) {
          s = fmaf(alibi_slope, alibi_at.key_offset(i), s);
          lse_term -= fmaf(alibi_row.step, alibi_at.row_offset(i), alibi_row.first);
        } else if constexpr (kAlibi) {
          s += alibi_at.symmetric(i, alibi_slope);
        }
        const bool visible = !kMasked || mask.key_visible(m_start + row, col);
        const float p = visible ? exp2f(s * params.softmax_scale_log2 - lse_term) : 0.f;
        tSrS(i) = p;
        tdPrdP(i) = p * (tdPrdP(i) - dsum[row]) * dcap;
      }
    };
    using Softcap = cute::bool_constant<kCap != Sm90BwdCap::kNone>;
    if constexpr (kCap != Sm90BwdCap::kNone) {
      scores(Softcap{}, cute::bool_constant<kCap == Sm90BwdCap::kCapAlibi>{});
    } else if (has_alibi) {  // false (compile-time) without Has_mods
      scores(Softcap{}, cute::true_type{});
    } else {
      scores(Softcap{}, cute::false_type{});
    }
    // P^T and dS^T as the A operands of dV += P^T dO and dK += dS^T Q.
    Tensor rP = convert_type<Element>(tSrS);
    Tensor rdS = convert_type<Element>(tdPrdP);
    Tensor tdVrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));
    Tensor tdKrdS = make_tensor(rdS.data(), acc_layout_as_A(rdS.layout()));
    // dS^T into shared memory for dQ = dS K (ordinary stores, read by the async proxy), before any
    // MMA reads rdS's registers.
    copy(copy_ds, copy_ds.get_thread_slice(tidx).retile_S(rdS), tdSsdS);
    wgmma_issue<false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, slot), acc_dv);
    dq_tile_free();  // the previous dQ's reduction has read sdQ, which is stored below
    cutlass::arch::fence_view_async_shared();
    __syncthreads();
    // dQ, then dK; dQ's stores into sdQ run while dK's MMAs do (the groups complete in order).
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
    wgmma_issue<true>(mma_dq, tdQrdS, tdQrKt, acc_dq);
    wgmma_issue<false>(mma_dkv, tdKrdS, tdKrQt(_, _, _, slot), acc_dk);
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc_dq);
    stage_dq(acc_dq, bidh, m_start);
    warpgroup_mma_done(acc_dv, acc_dk, tdVrP, tdKrdS);  // before the next step reuses Q's slot and these registers
  };

  // The dropout variant's step, and every step where kSplitHeadDim (see the top of the file): S and
  // dP with queries as rows, the SM80 backward's score transforms and mask, P^T and dS^T through
  // shared memory.
  auto bwd_step_rows = [&](int bidh, int m_block, int use, auto is_masked, bool has_next, int next_bidh,
                           int next_m_block) {
    const int m_start = m_block * kBlockM;
    const int slot = use % 2;
    begin_step(use, bidh, m_block);
    Tensor tSrS = partition_fragment_C(mma_sdp_rows, tile_mn);   // (MMA, MMA_M, MMA_N)
    Tensor tdPrdP = partition_fragment_C(mma_sdp_rows, tile_mn); // (MMA, MMA_M, MMA_N)
    Tensor tSrQ_slot = tSrQr(_, _, _, slot);
    Tensor tdPrdO_slot = tdPrdOr(_, _, _, slot);
    wgmma_issue<true>(mma_sdp_rows, tSrQ_slot, tSrKr, tSrS);
    wgmma_issue<true>(mma_sdp_rows, tdPrdO_slot, tdPrVr, tdPrdP);
    if constexpr (Is_det) dq_step_start();
    if (has_next) load_step(next_bidh, next_m_block, use + 1);  // while the MMAs run (bwd_step)
    // This thread's rows' LSE (log2 units) and D (with dropout times 1 - p: bwd_kernel.h's dropout note).
    Tensor lse_log2 = make_tensor<float>(Shape<Int<kRowsPerThread>>{});
    Tensor dsum = make_tensor<float>(Shape<Int<kRowsPerThread>>{});
#pragma unroll
    for (int mi = 0; mi < kRowsPerThread; ++mi) {
      const int row = get<0>(tScSr_rc(mi, 0));
      lse_log2(mi) = sLseD[slot * 2 * kBlockM + row] * float(M_LOG2E);
      dsum(mi) = sLseD[slot * 2 * kBlockM + kBlockM + row] * (Is_dropout ? 1.f - params.dropout.p : 1.f);
    }
    [[maybe_unused]] const float alibi_slope = Has_mods ? params.alibi_slope_scaled(bidb, bidh) : 0.f;
    // Dropout's words depend on the coordinates alone: drawn while the MMAs run.
    [[maybe_unused]] const auto dropout_words = draw_dropout_words_before_wait<Is_dropout>(
        dropout_rng, tScSr_blocks, uint32_t(bidb * params.heads + bidh), m_start, int(n_start));
    warpgroup_mma_done(tSrS, tdPrdP);
    if constexpr (kCap != Sm90BwdCap::kNone) apply_softcap(tSrS, params.softcap);
    if (has_alibi) {
      apply_alibi(tSrS, tScSr, m_start, int(n_start), binfo.seqlen_q, binfo.seqlen_k, alibi_causal_form(window),
                  alibi_slope);
    }
    if constexpr (decltype(is_masked)::value) mask.apply(tSrS, tScSr, m_start, int(n_start));
    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
    probs_from_lse(tSrS_rc, lse_log2, params.softmax_scale_log2);
    if constexpr (Is_dropout) {
      Tensor tSrS_blocks = make_tensor(tSrS.data(), acc_layout_mma_blocks(tSrS.layout()));  // ((2, 2), MMA_M, N / 8)
      negate_dropped(tSrS_blocks, dropout_words, dropout_rng.threshold);
    }
    Tensor tdPrdP_rc = make_tensor(tdPrdP.data(), acc_layout_rowcol(tdPrdP.layout()));  // (rows, cols)
    dscores<Is_dropout>(tdPrdP_rc, tSrS_rc, dsum);
    if constexpr (kCap != Sm90BwdCap::kNone) {
      softcap_dscores<Is_dropout>(tdPrdP_rc, tSrS_rc, lse_log2, params.softmax_scale_log2, tScSr, m_start,
                                  int(n_start), binfo.seqlen_q, binfo.seqlen_k, alibi_causal_form(window),
                                  alibi_slope);
    }
    Tensor rP = convert_type<Element>(tSrS);
    if constexpr (Is_dropout) relu_pairs(rP);
    Tensor rdS = convert_type<Element>(tdPrdP);
    copy(copy_pds_rows, copy_pds_rows.get_thread_slice(tidx).retile_S(rP), tPsP);
    copy(copy_pds_rows, copy_pds_rows.get_thread_slice(tidx).retile_S(rdS), tPsdS);
    dq_tile_free();  // the previous dQ's reduction has read sdQ, which is stored below
    cutlass::arch::fence_view_async_shared();
    __syncthreads();  // P^T and dS^T are in shared memory
    // dV, dQ, then dK; dQ's stores into sdQ run while dK's MMAs do (the groups complete in order).
    // Where kSplitHeadDim, dQ first: its stores (at 256 its atomics) run while dV's and dK's MMAs do
    // (session 57, H200: at 256 2-6 % faster, at 192 the same).
    Tensor acc_dq = partition_fragment_C(mma_dq_rows, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
    if constexpr (!Traits::kSplitHeadDim) {
      wgmma_issue<false>(mma_dkv_smem, tdVsPt, tdVrdOt(_, _, _, slot), acc_dv);
      wgmma_issue<true>(mma_dq_rows, tdQsdS, tdQsKt, acc_dq);
      wgmma_issue<false>(mma_dkv_smem, tdKsdSt, tdKrQt(_, _, _, slot), acc_dk);
      warpgroup_wait<1>();
    } else {
      wgmma_issue<true>(mma_dq_rows, tdQsdS, tdQsKt, acc_dq);
      wgmma_issue<false>(mma_dkv_smem, tdVsPt, tdVrdOt(_, _, _, slot), acc_dv);
      wgmma_issue<false>(mma_dkv_smem, tdKsdSt, tdKrQt(_, _, _, slot), acc_dk);
      warpgroup_wait<2>();
    }
    warpgroup_fence_operand(acc_dq);
    stage_dq(acc_dq, bidh, m_start);
    warpgroup_mma_done(acc_dv, acc_dk);  // before the next step reuses Q's slot, P^T and dS^T
  };

  if (range.m_block_max > range.m_block_min) {
    Tensor gK = gmem_row_tile<kBlockN, kHeadDim>(binfo.k_head<Element>(params.k, bidh_kv), params.k.row_stride, n_start);
    Tensor gV = gmem_row_tile<kBlockN, kHeadDim>(binfo.k_head<Element>(params.v, bidh_kv), params.v.row_stride, n_start);
    copy_or_zero<true, !Is_even_K>(gmem_tiled_copy, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK),
                                   tKVcKV, keys_left, params.head_dim);
    copy_or_zero<true, !Is_even_K>(gmem_tiled_copy, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV),
                                   tKVcKV, keys_left, params.head_dim);
    const int group = params.heads / params.heads_k;
    const int bidh_begin = bidh_kv * group, bidh_end = bidh_begin + group;
    const int steps = range.m_block_max - range.m_block_min;
    // Upwards, or deterministic downwards (rotated: from the n_block-th row block from the last), as
    // the SM80 backward walks (bwd_kernel.h).
    auto row_block = [&](int i) {
      return Is_det ? bwd_walk_row_block(i, range, n_block, true, rotated) : range.m_block_min + i;
    };
    if (params.sm90_tma) {
      if (tidx == 0) {
        q_ring.init(1, 1);
        cutlass::arch::fence_barrier_init();
      }
      __syncthreads();  // the barriers are set before any thread waits on them
    }
    load_step(bidh_begin, row_block(0), 0);
    int use = 0;
    for (int bidh = bidh_begin; bidh < bidh_end; ++bidh) {
      for (int i = 0; i < steps; ++i, ++use) {
        const int m_block = row_block(i);
        const bool last_of_head = i + 1 == steps;
        const bool has_next = !last_of_head || bidh + 1 < bidh_end;
        const int next_bidh = last_of_head ? bidh + 1 : bidh;
        const int next_m_block = Is_det ? row_block(last_of_head ? 0 : i + 1)
                                        : (last_of_head ? range.m_block_min : m_block + 1);
        auto step = [&](auto is_masked) {
          if constexpr (Traits::rows_step(kVariant)) {
            bwd_step_rows(bidh, m_block, use, is_masked, has_next, next_bidh, next_m_block);
          } else {
            bwd_step(bidh, m_block, use, is_masked, has_next, next_bidh, next_m_block);
          }
        };
        if (range.is_masked(m_block)) {
          step(cute::true_type{});
        } else {
          step(cute::false_type{});
        }
      }
    }
  }
  // The last dQ tile; dK and dV (0 where no query row saw these keys), through K's and V's shared
  // memory.
  cutlass::arch::fence_view_async_shared();
  __syncthreads();
  if constexpr (Is_det) {
    if (tidx == 0) {
      hand_on_added_dq();
      add_staged_dq(true);
    }
  } else {
    add_pending_dq();
  }
#pragma unroll
  for (int i = 0; i < size(acc_dk); ++i) {
    acc_dk(i) *= params.ds_scale();
    acc_dv(i) *= params.dv_scale();
  }
  Tensor gdK = gmem_row_tile<kBlockN, kHeadDim>(binfo.k_head<Element>(params.dk, bidh_kv), params.dk.row_stride, n_start);
  Tensor gdV = gmem_row_tile<kBlockN, kHeadDim>(binfo.k_head<Element>(params.dv, bidh_kv), params.dv.row_stride, n_start);
  store_tile_via_smem<typename Traits::SmemCopyAtomOut, typename Traits::GmemTiledCopyOut, Is_even_K>(
      mma_dkv, convert_type<Element>(acc_dk), sK, gdK, keys_left, params.head_dim, tidx, sync);
  store_tile_via_smem<typename Traits::SmemCopyAtomOut, typename Traits::GmemTiledCopyOut, Is_even_K>(
      mma_dkv, convert_type<Element>(acc_dv), sV, gdV, keys_left, params.head_dim, tidx, sync);
  if (tidx == 0) {
    bulk_wait();  // the CTA's shared memory lives until its last reduction is done
    if constexpr (Is_det) hand_on_added_dq();
  }
}

template <class Traits, bool Is_causal, bool Is_even_K, Variant kVariant, Sm90BwdCap kCap, bool Is_det>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flash_bwd_sm90_kernel(__grid_constant__ const BwdParams params, __grid_constant__ const BwdSm90Tma<Traits> tma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) char smem[];
  // Deterministic, in the SM80 backward's grid orders (bwd_grid_key_block_major).
  FwdWsTile tile{int(blockIdx.z), int(blockIdx.y), int(blockIdx.x)};
  if (!Is_det || !bwd_grid_key_block_major(Is_causal, true, params.dq_rotate)) {
    tile = bwd_cta_tile<Traits::kHeadDim, Traits::kBlockN, typename Traits::Element, Is_causal>(params, blockIdx.x);
  }
  bwd_sm90_col_block<Traits, Is_causal, Is_even_K, kVariant, kCap, Is_det>(params, tma, smem, tile.m_block,
                                                                          tile.bidb, tile.bidh);
#else
  __trap();
#endif
}

// The launches (launch_bwd_passes, bwd_epilogue.h): a 1-D grid of key blocks x batch x KV heads
// (bwd_cta_tile); deterministic, in the SM80 backward's orders (bwd_launch.h), whether the order
// rotates worked out on this kernel's key blocks.
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant, Sm90BwdCap kCap>
cudaError_t launch_bwd_sm90(BwdParams const& call, cudaStream_t stream) {
  using Traits =
      BwdKernelTraitsSm90<kHeadDim, typename ElementOf<kDType>::type, bwd_sm90_block_m(kHeadDim, kVariant, kCap)>;
  const int n_blocks = ceil_div(call.seqlen_k, Traits::kBlockN);
  if (call.deterministic && !bwd_sm90_deterministic(kHeadDim, kVariant)) {
    return cudaErrorNotSupported;  // the SM80 backward's (bwd_takes_sm90)
  }
  BwdParams params = call;
  // Q's and dO's loads: TMA where it can (FLASH_ATTN_CUTE_SM90_TMA, fwd_ws_tma.h), else cp.async.
  BwdSm90Tma<Traits> tma{};
  cudaError_t err = tma_descriptors(params, params.sm90_tma, tma);
  if (err != cudaSuccess) return err;
  dim3 grid;
  if constexpr (bwd_sm90_deterministic(kHeadDim, kVariant)) {
    if (params.deterministic) {
      params.dq_rotate = bwd_dq_rotate(true, params.window, n_blocks, params.num_sms);
      err = bwd_grid(params, n_blocks, bwd_grid_key_block_major(kIsCausal, true, params.dq_rotate), grid);
      if (err != cudaSuccess) return err;
      return launch_bwd_passes<Traits>(flash_bwd_sm90_kernel<Traits, kIsCausal, kIsEvenK, kVariant, kCap, true>, grid,
                                       Traits::smem_bytes_det(kVariant), params, stream, tma);
    }
  }
  err = bwd_grid(params, n_blocks, false, grid);
  if (err != cudaSuccess) return err;
  return launch_bwd_passes<Traits>(flash_bwd_sm90_kernel<Traits, kIsCausal, kIsEvenK, kVariant, kCap, false>, grid,
                                   Traits::smem_bytes(kVariant), params, stream, tma);
}

template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_bwd_sm90(BwdParams const& params, cudaStream_t stream) {
  if constexpr (kVariant == Variant::kScoreMods) {
    if (params.softcap > 0.f) {
      return params.alibi_slopes
                 ? launch_bwd_sm90<kDType, kHeadDim, kIsCausal, kIsEvenK, kVariant, Sm90BwdCap::kCapAlibi>(params, stream)
                 : launch_bwd_sm90<kDType, kHeadDim, kIsCausal, kIsEvenK, kVariant, Sm90BwdCap::kCap>(params, stream);
    }
  }
  if constexpr (kVariant == Variant::kDropout) {
    if (params.softcap > 0.f) {
      return launch_bwd_sm90<kDType, kHeadDim, kIsCausal, kIsEvenK, kVariant, Sm90BwdCap::kCap>(params, stream);
    }
  }
  return launch_bwd_sm90<kDType, kHeadDim, kIsCausal, kIsEvenK, kVariant, Sm90BwdCap::kNone>(params, stream);
}

}  // namespace flash_attn_cute
