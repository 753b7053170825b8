// The warp-specialized Hopper forward (sm_90a), head dims from 64 on (tile_size.h): one persistent
// CTA per SM of three warpgroups, taking its tiles from a counter (tile_order.h). Warpgroup 0, the
// producer, loads Q and streams K and V through rings of shared-memory buffers (SmemRing, wgmma.h):
// by TMA where the tensors allow it (fwd_ws_tma.h; varlen and seqused_k too, with the rows past a
// sequence's end zeroed after they land), else with cp.async as the other kernels' copies (left
// padding, kv_batch_idx, paged caches, unaligned strides). Warpgroups 1 and 2, the consumers, own 64
// query rows each and take turns at the tensor cores (ping-pong): in its turn a consumer issues
// P V of the previous key block and Q K^T of the next, then runs the softmax while the other
// consumer's turn keeps the tensor cores busy (with kOverlapPV, Q K^T first, and the softmax also
// overlaps its own P V). A consumer takes no work in the turns of key blocks its own rows do not
// see, nor in a tile whose rows past the sequence's end are all it has. Every variant of
// fwd_kernel.h (plain, score mods, dropout).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "block_info.h"
#include "dropout.h"
#include "fwd_api.h"
#include "fwd_epilogue.h"
#include "fwd_mainloop.h"
#include "fwd_ws_tma.h"
#include "kernel_traits_sm90.h"
#include "launch.h"
#include "mask.h"
#include "params.h"
#include "softmax.h"
#include "tile_order.h"
#include "utils.h"
#include "wgmma.h"

namespace flash_attn_cute {

using namespace cute;

// Named barriers: one per consumer for its turn, one for the producer, one per consumer for its
// epilogue (each consumer stores its own rows of O: none waits for another's).
inline constexpr int kMaxConsumers = 3;
inline constexpr int kTurnBarrier = 1;  // + consumer index
inline constexpr int kProducerBarrier = kTurnBarrier + kMaxConsumers;
inline constexpr int kEpilogueBarrier = kProducerBarrier + 1;  // + consumer index
inline constexpr int kCheckBarrier = kEpilogueBarrier + kMaxConsumers;  // + consumer index

template <int kStages, int kQStages>
struct FwdWsBarriers {
  SmemRing<kQStages> q;  // Q's buffers (one holds the tile's O in the epilogue where O has none of its own)
  SmemRing<kStages> k;
  SmemRing<kStages> v;
  uint64_t tail;         // a box whose rows past its sequence's end the producer zeroes (fwd_ws_produce)
  int q_tile[kQStages];  // the tile whose Q a buffer holds, -1 when there is none left (set with Q)
  int next_tile[2];      // the producer's tiles fetched from the counter, alternately
};
static_assert(sizeof(FwdWsBarriers<kFwdSm90WsStages, 2>) <= kFwdSm90WsBarrierBytes);
template <class Traits>
using FwdWsBarriersOf = FwdWsBarriers<Traits::kStages, Traits::kQStages>;

// Whether a tile's walk starts at its diagonal's block (non-causal rows with ALiBi), not at the top.
template <class Traits, bool Is_causal>
__device__ __forceinline__ bool fwd_ws_peak_first(FwdParams const& params) {
  return Traits::kVariant != Variant::kPlain && !Is_causal && params.alibi_slopes != nullptr;
}
// The order of a tile's key blocks, the producer's and the consumers': with ALiBi, non-causal rows
// start at their diagonal's block (KeyBlockWalk), else top-down.
template <class Traits, bool Is_causal>
__device__ __forceinline__ KeyBlockWalk fwd_ws_walk(FwdParams const& params, NBlockRange const& range, int m_block,
                                                    BlockInfo const& binfo) {
  const bool peak_first = fwd_ws_peak_first<Traits, Is_causal>(params);
  return fwd_key_block_walk(range, peak_first, m_block * Traits::kBlockM, Traits::kBlockN, binfo.seqlen_q,
                            binfo.seqlen_k);
}

// The producer: per tile, Q with the tile's index, then K(n) and V(n) for the key blocks in the
// consumers' order, fwd_ws_walk's. The rings run on across tiles, but a tile's K and V wait behind
// its Q, which waits for its buffer: with two Q buffers (where O has shared memory of its own, up
// to head dim 128) until the consumers' last Q K^T of the tile before last, else until the last
// tile's epilogue. Tiles past a varlen sequence's end are skipped here; after the last tile, a Q
// buffer comes with the index -1.
template <class Traits, bool Is_causal, bool Is_even_K>
__device__ __forceinline__ void fwd_ws_produce(FwdParams const& params, FwdWsTma<Traits> const& tma,
                                               FwdWsTileOrder const& tiles, Window window,
                                               FwdWsBarriersOf<Traits>& barriers,
                                               typename Traits::Element* smem_q, typename Traits::Element* smem_k,
                                               typename Traits::Element* smem_v) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  const int tidx = threadIdx.x;
  typename Traits::GmemTiledCopyQKV gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tidx);
  int i = 0, q_use = 0;  // uses of the K / V rings and of Q's buffer
  // The tile after the fetch-th: thread 0 takes it from the counter at the fetch-th's start (the
  // atomic's latency hides behind the loads), every producer thread reads it at its end. A launch
  // makes one fetch per tile, n_tiles in all, and atomicInc wraps the counter back to 0 with the
  // last: the next launch finds it zeroed, so the caller can keep one counter per stream.
  auto next_tile = [&](int fetch) {
    named_barrier_sync(kProducerBarrier, Traits::kNProducerThreads);
    return warp_uniform(barriers.next_tile[fetch & 1]);
  };
  // By TMA thread 0 alone fills the buffers, and it alone waits for them to be free: a thread that
  // waits on a ring's empty barriers without filling the ring can fall two phases behind it and then
  // read a later phase's parity as not done, and wait for good (session 36: the producer-store
  // branch hung so on many short tiles). With cp.async every thread fills its part.
  const bool waits_for_buffers = !params.ws_tma || tidx == 0;
  // By TMA, a box's rows past its sequence's end are the next sequence's (varlen's packed rows) or
  // keys past seqused_k, not the zeros TMA fills in past the tensor's end. Where a box has such
  // rows that matter (Q's past the last row, V's past the last key; K's scores there are masked to
  // -inf whatever K holds), warp 0 waits for the box on the tail barrier, zeroes them as cp.async
  // leaves them, fences its writes for the MMAs' async proxy, and then fills the buffer.
  const bool q_tails = params.cu_seqlens_q != nullptr;
  const bool v_tails = params.cu_seqlens_k != nullptr || params.seqused_k != nullptr;
  uint32_t tail_phase = 0;
  // Thread 0's TMA copy (`issue`, to the barrier it is given) of `bytes` into `box`, use `use` of
  // `ring`: to the buffer's barrier, or, where `tails` says rows from `rows` on may be another's,
  // to the tail barrier, and warp 0 zeroes them before thread 0 fills the buffer's.
  auto land = [&](auto& ring, int use, uint32_t bytes, auto& box, int rows, bool tails, auto const& issue) {
    const bool zero_tail = tails && rows < int(size<0>(box));
    if (zero_tail ? tidx >= 32 : tidx != 0) return;
    if (tidx == 0) {
      uint64_t& barrier = zero_tail ? barriers.tail : ring.full_barrier(use);
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&barrier, bytes);
      issue(barrier);
    }
    if (!zero_tail) return;
    cutlass::arch::ClusterBarrier::wait(&barriers.tail, tail_phase);
    tail_phase ^= 1u;
    zero_rows_from(box, rows, tidx, 32);
    cutlass::arch::fence_view_async_shared();
    __syncwarp();
    if (tidx == 0) ring.commit_tma(use, 0);
  };
  // The redo pass (FwdParams::redo_tiles, the checked kernels only) walks the listed tiles alone.
  const bool redo = sm90_checks_offset<Traits::kLoops> && params.redo_pass == RedoPass::kRedo;
  const int n_tiles = redo ? params.redo_tiles[0] : tiles.n_tiles();
  for (int t = blockIdx.x, fetch = 0; t < n_tiles; t = next_tile(fetch++)) {
    if (tidx == 0) {
      const unsigned last = unsigned(n_tiles - 1);
      barriers.next_tile[fetch & 1] = int(gridDim.x) + int(atomicInc(reinterpret_cast<unsigned*>(params.tile_counter), last));
    }
    // The partitions are built per tile: held across the loop, their coordinates took registers
    // the producer does not have.
    Tensor sQ = make_tensor(make_smem_ptr(smem_q + barriers.q.stage(q_use) * cosize_v<typename Traits::SmemLayoutQ>),
                            typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim): this tile's buffer
    Tensor tQsQ = gmem_thr_copy.partition_D(sQ);  // (CPY, CPY_M, CPY_K)
    Tensor tQcQ = gmem_thr_copy.partition_S(
        make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));  // (CPY, CPY_M, CPY_K) -> (m, k)
    Tensor tKVcKV = gmem_thr_copy.partition_S(
        make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));  // (CPY, CPY_N, CPY_K) -> (n, k)
    const int tile_index = redo ? params.redo_tiles[1 + t] : t;
    const FwdWsTile tile = tiles.tile<Is_causal>(tile_index);
    const BlockInfo binfo(params, tile.bidb);
    if (tile.m_block * kBlockM >= binfo.seqlen_q) continue;
    const NBlockRange range = fwd_n_block_range(tile.m_block, kBlockM, kBlockN, binfo.seqlen_q, binfo.seqlen_k, window);
    const index_t m_start = index_t(tile.m_block) * kBlockM;
    if (waits_for_buffers) barriers.q.acquire(q_use);
    // Published by this thread's arrive on the buffer's barrier.
    if (tidx == 0) barriers.q_tile[barriers.q.stage(q_use)] = tile_index;
    if (params.ws_tma) {  // thread 0 loads and commits (warp 0 with a tail to zero)
      if (range.n_block_max > range.n_block_min) {
        auto issue_q = [&](uint64_t& barrier) {
          tma_load_row_block<typename FwdWsTma<Traits>::TileQ>(tma.q, tma_shape_q(params), int(binfo.q_row_start),
                                                               tile.bidh, binfo.is_varlen ? 0 : tile.bidb,
                                                               tile.m_block, sQ, barrier);
        };
        land(barriers.q, q_use, FwdWsTma<Traits>::kBytesQ, sQ, binfo.seqlen_q - int(m_start), q_tails, issue_q);
      } else if (tidx == 0) {
        barriers.q.commit_tma(q_use, 0);
      }
      ++q_use;
    } else if (range.n_block_max > range.n_block_min) {
      Tensor gQ = gmem_row_tile<kBlockM, kHeadDim>(binfo.q_head<Element>(params.q, tile.bidb, tile.bidh),
                                                   params.q.row_stride, m_start);  // (kBlockM, kHeadDim)
      copy_or_zfill<true, !Is_even_K>(gmem_tiled_copy, gmem_thr_copy.partition_S(gQ), tQsQ, tQcQ,
                                     binfo.seqlen_q - int(m_start), params.head_dim);
    }
    if (!params.ws_tma) barriers.q.commit(q_use++);
    const int bidh_kv = tile.bidh / (params.heads / params.heads_k);
    auto key_blocks = [&](TensorView const& view) {  // (CPY, CPY_N, CPY_K, n)
      return gmem_thr_copy.partition_S(gmem_row_tiles<kBlockN, kHeadDim>(
          binfo.k_head<Element>(view, bidh_kv), view.row_stride, range.n_block_max));
    };
    Tensor tKgK = key_blocks(params.k);
    Tensor tVgV = key_blocks(params.v);
    // Each buffer as a tensor of its own (a runtime offset into one tensor over all of them would
    // leave the swizzle to be computed at run time, element by element). Only a tile's top key
    // block can end past seqlen_k.
    auto load = [&](SmemRing<Traits::kStages>& ring, Element* smem_ring, auto const& tgmem, int n_block, bool top) {
      ring.acquire(i);
      Tensor tsmem = gmem_thr_copy.partition_D(
          make_tensor(make_smem_ptr(smem_ring + ring.stage(i) * cosize_v<typename Traits::SmemLayoutKVStage>),
                      typename Traits::SmemLayoutKVStage{}));  // (CPY, CPY_N, CPY_K)
      const int keys_left = binfo.seqlen_k - n_block * kBlockN;
      if (top) {
        copy_or_zfill<true, !Is_even_K>(gmem_tiled_copy, tgmem(_, _, _, n_block), tsmem, tKVcKV, keys_left,
                                       params.head_dim);
      } else {
        copy_or_zfill<false, !Is_even_K>(gmem_tiled_copy, tgmem(_, _, _, n_block), tsmem, tKVcKV, keys_left,
                                        params.head_dim);
      }
      ring.commit(i);
    };
    // By TMA: thread 0 waits for the buffer, then lands the box (the sequence's keys from k_row_start).
    auto load_tma = [&](SmemRing<Traits::kStages>& ring, Element* smem_ring, auto const& tma_kv, int n_block,
                        bool tails) {
      if (tidx == 0) ring.acquire(i);
      Tensor sKV = make_tensor(make_smem_ptr(smem_ring + ring.stage(i) * cosize_v<typename Traits::SmemLayoutKVStage>),
                               typename Traits::SmemLayoutKVStage{});  // (kBlockN, kHeadDim)
      auto issue_kv = [&](uint64_t& barrier) {
        tma_load_row_block<typename FwdWsTma<Traits>::TileKV>(tma_kv, FwdWsTma<Traits>::shape_kv(params),
                                                              int(binfo.k_row_start), bidh_kv, binfo.k_batch, n_block,
                                                              sKV, barrier);
      };
      land(ring, i, FwdWsTma<Traits>::kBytesKV, sKV, binfo.seqlen_k - n_block * kBlockN, tails, issue_kv);
    };
    const KeyBlockWalk walk = fwd_ws_walk<Traits, Is_causal>(params, range, tile.m_block, binfo);
    for (int step = 0; step < walk.steps(); ++step, ++i) {
      const int n_block = walk.n_block(step);
      if (params.ws_tma) {
        load_tma(barriers.k, smem_k, tma.k, n_block, false);
        load_tma(barriers.v, smem_v, tma.v, n_block, v_tails);
      } else {
        const bool top = n_block == range.n_block_max - 1;
        load(barriers.k, smem_k, tKgK, n_block, top);
        load(barriers.v, smem_v, tVgV, n_block, top);
      }
    }
  }
  if (waits_for_buffers) barriers.q.acquire(q_use);
  if (tidx == 0) barriers.q_tile[barriers.q.stage(q_use)] = -1;
  if (!params.ws_tma) {
    barriers.q.commit(q_use);
  } else if (tidx == 0) {
    barriers.q.commit_tma(q_use, 0);
  }
  cp_async_wait<0>();  // no thread leaves with copies in flight
}

// The consumers: per tile (its index from Q's buffer, -1 for the end), the key blocks in turns with
// the other consumer, then the epilogue (O through sO, and the LSE).
template <class Traits, bool Is_causal, bool Is_even_K, Variant kVariant, bool Is_softcap>
__device__ __forceinline__ void fwd_ws_consume(FwdParams const& params, FwdWsTileOrder const& tiles, Window window,
                                               FwdWsBarriersOf<Traits>& barriers,
                                               typename Traits::Element* smem_q, typename Traits::Element* smem_k,
                                               typename Traits::Element* smem_v, typename Traits::Element* smem_o) {
  static_assert(Traits::kConsumers >= 2 && Traits::kConsumers <= kMaxConsumers);
  constexpr bool Has_mods = kVariant != Variant::kPlain;
  constexpr bool Is_dropout = kVariant == Variant::kDropout;
  using Element = typename Traits::Element;
  // Split softcap: each of its kernels holds one loop (Traits::kLoops, run_fwd_sm90_ws).
  constexpr Sm90Loops kLoops = Traits::kLoops;
  static_assert((kLoops != Sm90Loops::kPerTile) == (Is_softcap && kFwdWsSoftcapSplit<Element, kVariant>));
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQStages{});  // (kBlockM, kHeadDim, stage)
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});   // (kBlockN, kHeadDim, stage)
  Tensor sVt = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutVt{});  // (kHeadDim, kBlockN, stage)
  Tensor sO = make_tensor(make_smem_ptr(smem_o), typename Traits::SmemLayoutO{});    // (kBlockM, kHeadDim)
  const int tidx = threadIdx.x - Traits::kNProducerThreads;
  const int consumer = warp_uniform(tidx / 128);  // known warp-uniform: branches on it stay uniform
  auto sync_epilogue = [&] { named_barrier_sync(kEpilogueBarrier + consumer, 128); };
  typename Traits::TiledMmaS tiled_mma_s;
  typename Traits::TiledMma tiled_mma_o;
  auto thr_mma_s = tiled_mma_s.get_thread_slice(tidx);
  auto thr_mma_o = tiled_mma_o.get_thread_slice(tidx);
  auto tile_mn = Shape<Int<kBlockM>, Int<kBlockN>>{};
  Tensor tSrQ = thr_mma_s.partition_fragment_A(sQ);    // (MMA, MMA_M, MMA_K, stage)
  Tensor tSrK = thr_mma_s.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_K, stage)
  Tensor tOrVt = thr_mma_o.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
  Tensor tOrO = partition_fragment_C(tiled_mma_o, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
  Tensor tScS = thr_mma_s.partition_C(make_identity_tensor(tile_mn));  // (MMA, MMA_M, MMA_N)
  Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));  // (rows, cols) -> (m, n)
  CUTE_STATIC_ASSERT_V(size<2>(tSrQ) == size<2>(tSrK));              // Q K^T's k-slabs
  CUTE_STATIC_ASSERT_V(size<2>(tOrVt) * Int<16>{} == Int<kBlockN>{});  // P V's k-slabs: P's 16-key pairs
  // P of the last softmax, the A operand of the next turn's P V.
  Tensor tOrP = make_tensor<Element>(acc_layout_as_A(partition_fragment_C(tiled_mma_s, tile_mn).layout()));
  Tensor tOrO_rc = make_tensor(tOrO.data(), acc_layout_rowcol(tOrO.layout()));  // (rows, head_dim cols)
  Tensor tScS_blocks = make_tensor(tScS.data(), acc_layout_mma_blocks(tScS.layout()));  // ((2, 2), MMA_M, N / 8)
  [[maybe_unused]] DropoutRng dropout_rng(0, 0, 0);
  if constexpr (Is_dropout) dropout_rng = make_dropout_rng(params.dropout);

  // Turns: consumer 0, 1, .., 0, 1, .. over all tiles; each arrives on the next one's barrier when
  // its MMAs are issued. The last consumer's arrive before any turn lets consumer 0 start; consumer
  // 0's wait at the end takes the last one's arrive after its last turn.
  constexpr int kLast = Traits::kConsumers - 1;
  auto take_turn = [&] { named_barrier_sync(kTurnBarrier + consumer, 2 * 128); };
  auto pass_turn = [&] { named_barrier_arrive(kTurnBarrier + (consumer == kLast ? 0 : consumer + 1), 2 * 128); };
  if (consumer == kLast) pass_turn();

  // Whether the producer's copies are cp.async's, which SmemRing::wait fences for the MMAs.
  const bool generic_writes = !params.ws_tma;
  int i = 0;  // uses of the K / V rings, as the producer counts them
  // A tile's turns without its work, for a consumer whose rows all lie past the sequence's end: the
  // other consumers' turns and the rings' counts go on as if it took part. It waits for each buffer
  // before releasing it: released sooner, its arrival could count toward the buffer's last use.
  auto idle_turns = [&](int steps) {
    for (int s = 0; s < steps; ++s, ++i) {
      barriers.k.wait(i, generic_writes);
      if (s > 0) barriers.v.wait(i - 1, generic_writes);
      take_turn();
      pass_turn();
      barriers.k.release(i);
      if (s > 0) barriers.v.release(i - 1);
    }
    if (steps > 0) {  // the last P V's turn
      barriers.v.wait(i - 1, generic_writes);
      take_turn();
      pass_turn();
      barriers.v.release(i - 1);
    }
  };
  for (int q_use = 0;; ++q_use) {  // uses of Q's buffers, one per tile
    barriers.q.wait(q_use, generic_writes);
    const int t = warp_uniform(barriers.q_tile[barriers.q.stage(q_use)]);
    if (t < 0) break;
    const FwdWsTile tile = tiles.tile<Is_causal>(t);
    const int bidb = tile.bidb, bidh = tile.bidh;
    const BlockInfo binfo(params, bidb);
    const NBlockRange range = fwd_n_block_range(tile.m_block, kBlockM, kBlockN, binfo.seqlen_q, binfo.seqlen_k, window);
    const int rows_left = binfo.seqlen_q - tile.m_block * kBlockM;
    const index_t m_start = index_t(tile.m_block) * kBlockM;
    // The bottom tile of a sequence whose length is not a multiple of kBlockM (varlen's, and every
    // power of two on 192-row tiles) can leave a consumer no row of its own: it skips the tile's MMAs,
    // softmax and epilogue, and the SM's issue slots and tensor cores go to the consumers with rows.
    if (rows_left <= consumer * (kBlockM / Traits::kConsumers)) {
      idle_turns(range.n_block_max - range.n_block_min);
      barriers.q.release(q_use);
      continue;
    }
    Softmax<2 * decltype(size<1>(tOrO))::value, Traits::kLazyRescale, !Is_softcap> softmax;
    const FwdMask mask{binfo.seqlen_q, binfo.seqlen_k, window};
    const float alibi_slope = Has_mods ? params.alibi_slope_scaled(bidb, bidh) : 0.f;
    const bool has_alibi = alibi_slope != 0.f;  // the tile's, warp-uniform: no bias work without a slope
    const bool alibi_loop = sm90_alibi_loop<Is_softcap, Element, kLoops>(has_alibi, params.softmax_scale_log2);
    const bool fixes_offset = sm90_fixes_offset<Is_softcap, Element, kLoops>(alibi_loop);
    [[maybe_unused]] const uint32_t bh = uint32_t(bidb * params.heads + bidh);
    Tensor tSrQ_tile = tSrQ(_, _, _, barriers.q.stage(q_use));  // (MMA, MMA_M, MMA_K): this tile's buffer
    // After softcap's tanh the causal kernels' ALiBi bias takes the causal form, slope * (col -
    // alibi_col_ref): one add a score, the column's product shared by a thread's rows, against the
    // symmetric form's two. Every key a row sees there lies left of its diagonal (window.right is
    // 0), where this form is the symmetric one plus slope * (diag(row) - alibi_col_ref), the row's
    // shift. Measured from the tile's first diagonal, not from column 0 (flash-attn's causal form,
    // whose biases grow with the column), a row's largest biases stay small and exact in fp32: from
    // column 0 the exponents near the diagonal lost ~2^-24 * slope * col (1.6e-3 of O at slope 1
    // and 16k keys in a float32 simulation, the LSE in a window 3.7e-3 at 32k). Before Q K^T
    // (fill_alibi, without softcap) the bias keeps the symmetric form. Measured on H200 (session 47,
    // bf16, 16k tokens, causal softcap + ALiBi): hdim 128 2.09 -> 2.00 ms (a cap of 60 too). At hdim
    // 64, whose steps' tanh and exponentials keep the MUFU unit busiest, 2.92 -> 2.99 though its
    // ALiBi loop lost 62 of 1677 instructions a trip: it keeps the symmetric form there.
    constexpr bool kAlibiCausal = Is_softcap && Is_causal && kHeadDim > 64;
    const int alibi_col_ref = kAlibiCausal ? int(m_start) + binfo.seqlen_k - binfo.seqlen_q : 0;
    // After the tanh the non-causal kernels on fixed offsets take the side form (apply_alibi_side):
    // a block after the walk's diagonal steps lies wholly left or right of every row's diagonal in
    // the tile, above last_diagonal_block on the right. One FFMA a score there; the row's shift
    // (alibi_side_shift) moves the exponent's offset, which the running max could not follow. The
    // diagonal steps run masked, with the symmetric form. Not in hdim 256's checked kernel: its
    // side-form and checked steps together kept O in local memory (an 816-byte frame, 2500 local
    // loads and stores a trip; session 55, H100, non-causal 16k tokens with a cap of 200: 60.5 ms
    // against 3.5 without the side form).
    constexpr bool kAlibiSides = Is_softcap && !Is_causal && kHeadDim >= 64 && sm90_alibi_loop_only<kLoops> &&
                                 (kHeadDim < 256 || kLoops == Sm90Loops::kAlibiFixedOffset);
    [[maybe_unused]] const int last_diagonal_block =
        floor_div(int(m_start) + kBlockM - 1 + binfo.seqlen_k - binfo.seqlen_q, kBlockN);
    // bf16 softcap's fixed offsets (BoundedScores): from the start (fixes_offset), or the checked
    // kernels' once the running max reaches them.
    auto row_bias = [&](int mi) {
      if constexpr (sm90_alibi_loop_only<kLoops>) {
        const int row = int(m_start) + get<0>(tScS_rc(mi, 0));
        const float shift =
            kAlibiCausal ? float(alibi_causal_shift(row, binfo.seqlen_q, binfo.seqlen_k) - alibi_col_ref) : 0.f;
        return mask.alibi_max_bias(row, alibi_slope) + alibi_slope * shift;
      } else {
        return 0.f;
      }
    };
    [[maybe_unused]] const auto fixed_offsets = softmax.fixed_offsets(params.softmax_scale_log2, row_bias);
    clear(tOrO);
    // The key blocks this consumer's own rows see, within the tile's (a causal diagonal or a window
    // edge can leave it none of a tile's top or bottom blocks); its steps on the others only keep the
    // turns and the rings' counts. In the top-down walk its own blocks follow each other, the first
    // of them masked (its rows' diagonal or right edge lies in it) unless it is the tile's first, so
    // an unmasked step is always its own and always follows one. The walk from ALiBi's peak takes
    // the tile's blocks. pending_pv: the last step's P awaits its P V (no skip has flushed it).
    const NBlockRange own =
        fwd_ws_peak_first<Traits, Is_causal>(params)
            ? range
            : fwd_n_block_range(tile.m_block * Traits::kConsumers + consumer, kBlockM / Traits::kConsumers, kBlockN,
                                binfo.seqlen_q, binfo.seqlen_k, window);
    bool pending_pv = false;

    // One key block: in a turn, O += P V of the previous block and S = Q K^T of this one; then
    // mask and online softmax into P. With kOverlapPV, Q K^T is issued first and the softmax's
    // exponentials run while P V does: only O's rescale waits for it. Use i of the rings holds this
    // block's K and V. The score mods as in fwd_kernel.h: without softcap, ALiBi (where the head has
    // a slope) is S's initial value and Q K^T accumulates onto it; softcap's tanh comes first, then
    // the bias. offset (StepOffset): kFixed, bf16 softcap's fixed offsets, whose softmax takes no
    // max; kChecked, the running max, then the fixed offsets if all of the consumer's rows reach them
    // (a vote). Returns whether the step ends on the fixed offsets.
    auto fwd_step = [&](int n_block, auto is_masked, bool is_first, auto with_softcap, auto with_alibi,
                        auto offset) __attribute__((always_inline)) {
      constexpr bool kSoftcap = decltype(with_softcap)::value;
      constexpr bool kBiasFirst = !kSoftcap && decltype(with_alibi)::value;
      constexpr StepOffset kOffset = decltype(offset)::value;
      constexpr bool kOverlap = Traits::kOverlapPV;
      constexpr bool kMasked = decltype(is_masked)::value;
      auto issue_pv = [&] { wgmma_issue<false>(tiled_mma_o, tOrP, tOrVt(_, _, _, barriers.v.stage(i - 1)), tOrO); };
      if constexpr (kMasked) {
        if (n_block < own.n_block_min || n_block >= own.n_block_max) {  // not this consumer's block
          barriers.k.wait(i, generic_writes);
          if (!is_first) barriers.v.wait(i - 1, generic_writes);
          take_turn();
          if (pending_pv) {
            issue_pv();
          } else {
            warpgroup_commit_batch();  // empty: the wait below counts alike on both paths (see the step's)
          }
          pass_turn();
          barriers.k.release(i);
          warpgroup_mma_done(tOrO, tOrP);
          if (!is_first) barriers.v.release(i - 1);
          pending_pv = false;
          ++i;
          return kOffset == StepOffset::kFixed;
        }
      }
      const bool pending = !kMasked || pending_pv;  // else this consumer's first block of the tile
      Tensor tSrS = partition_fragment_C(tiled_mma_s, tile_mn);  // (MMA, MMA_M, MMA_N)
      if constexpr (kBiasFirst) {
        fill_alibi(tSrS, tScS, int(m_start), n_block * kBlockN, binfo.seqlen_q, binfo.seqlen_k, alibi_slope);
      }
      barriers.k.wait(i, generic_writes);
      if (!is_first) barriers.v.wait(i - 1, generic_writes);
      take_turn();
      if (!kOverlap && pending) issue_pv();
      wgmma_issue<!kBiasFirst>(tiled_mma_s, tSrQ_tile, tSrK(_, _, _, barriers.k.stage(i)), tSrS);
      if constexpr (kOverlap) {
        if (pending) {
          issue_pv();
        } else {
          warpgroup_commit_batch();  // an empty batch: every step's waits count alike (else ptxas serializes the MMAs)
        }
      }
      pass_turn();
      // Dropout's words depend on the coordinates alone: with two consumers drawn while this turn's
      // MMAs run, with three where they are used (held across the wait, they spilled in the key loop).
      constexpr bool kEarlyWords = Is_dropout && Traits::kConsumers == 2;
      [[maybe_unused]] const auto early_words =
          draw_dropout_words_before_wait<kEarlyWords>(dropout_rng, tScS_blocks, bh, int(m_start), n_block * kBlockN);
      if constexpr (kOverlap) {
        warpgroup_mma_done<1>(tSrS);  // Q K^T; P V may still run
      } else {
        warpgroup_mma_done(tSrS, tOrO, tOrP);
      }
      barriers.k.release(i);
      if (!kOverlap && !is_first) barriers.v.release(i - 1);
      constexpr bool kSide = kAlibiSides && decltype(with_alibi)::value && !kMasked && kOffset == StepOffset::kFixed;
      [[maybe_unused]] const float side_slope = n_block > last_diagonal_block ? -alibi_slope : alibi_slope;
      if constexpr (kSide) {
        apply_softcap(tSrS, params.softcap);
        apply_alibi_side(tSrS, tScS, side_slope);
      } else {
        fwd_score_mods<kSoftcap, decltype(is_masked)::value, decltype(with_alibi)::value>(
            tSrS, tScS, int(m_start), n_block * kBlockN, mask, params.softcap, alibi_slope, kAlibiCausal, alibi_col_ref);
      }
      Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
      constexpr int kFmaExp2Every = Traits::fma_exp2_every(kSoftcap);
      const float scale_log2 = params.softmax_scale_log2;
      // With kOverlap, P V ran during the exponentials: O is ready once it is done.
      auto pv_done = [&] __attribute__((always_inline)) {
        if constexpr (kOverlap) {
          warpgroup_mma_done(tOrO, tOrP);
          if (!is_first) barriers.v.release(i - 1);
        }
      };
      auto rescale_o_after_pv = [&](auto const& rescale) __attribute__((always_inline)) {
        pv_done();
        softmax.rescale_by(rescale, tOrO_rc);
      };
      bool fixed_offset = kOffset == StepOffset::kFixed;
      if constexpr (kSide) {
        typename decltype(softmax)::RowTensor shift;
        alibi_side_shift(shift, tScS, int(m_start), n_block * kBlockN, binfo.seqlen_q, binfo.seqlen_k, side_slope);
        softmax.template exponentiate_shifted<kFmaExp2Every>(tSrS_rc, scale_log2, shift);
        pv_done();
      } else if constexpr (kOffset == StepOffset::kChecked) {
        static_assert(kMasked);
        auto rescale = softmax.template step_offsets<true>(!pending, tSrS_rc, scale_log2);
        fixed_offset = named_barrier_all(kCheckBarrier + consumer, 128, softmax.offsets_reach(fixed_offsets, scale_log2));
        if (fixed_offset) softmax.move_to_fixed(fixed_offsets, scale_log2, rescale);
        softmax.template exponentiate<true, kFmaExp2Every>(tSrS_rc, scale_log2);
        rescale_o_after_pv(rescale);
      } else if constexpr (kOverlap) {
        rescale_o_after_pv(softmax.template step_exp<kMasked, kFmaExp2Every, kOffset == StepOffset::kFixed>(
            !pending, tSrS_rc, scale_log2));
      } else {
        softmax.template rescale_o<kMasked, kFmaExp2Every, kOffset == StepOffset::kFixed>(!pending, tSrS_rc, tOrO_rc,
                                                                                         scale_log2);
      }
      Tensor rP = convert_type<Element>(tSrS);  // (MMA, MMA_M, MMA_N)
      if constexpr (Is_dropout) {
        Tensor rP_blocks = make_tensor(rP.data(), acc_layout_mma_blocks(rP.layout()));  // ((2, 2), MMA_M, N / 8)
        if constexpr (kEarlyWords) {
          zero_dropped(rP_blocks, early_words, dropout_rng.threshold);
        } else {
          zero_dropped(rP_blocks, dropout_rng, tScS_blocks, bh, int(m_start), n_block * kBlockN);
        }
      }
#pragma unroll
      for (int j = 0; j < size(rP); ++j) tOrP(j) = rP(j);
      pending_pv = true;
      ++i;
      return fixed_offset;
    };

    const bool has_keys = range.n_block_max > range.n_block_min;
    if (has_keys) {
      if (fixes_offset) softmax.fix_offset(params.softmax_scale_log2, row_bias);
      KeyBlockWalk walk = fwd_ws_walk<Traits, Is_causal>(params, range, tile.m_block, binfo);
      if constexpr (kAlibiSides) walk.n_lead = diagonal_steps(walk, last_diagonal_block);
      // A checked kernel's tile: its rows span this many key blocks, in which each finds its first key.
      constexpr int kCheckSteps = ceil_div(kBlockM, kBlockN) + 1;
      fwd_walk_sm90<Has_mods, Is_softcap, Element, kLoops, kCheckSteps, kAlibiSides>(own, walk, alibi_loop, fwd_step);
      // The tile's Q K^T are done. With O in shared memory of its own, the producer may now load
      // a later tile's Q into the buffer.
      if constexpr (Traits::kSeparateO) barriers.q.release(q_use);
      // The last turn: P V of the bottom key block, unless it was not this consumer's.
      barriers.v.wait(i - 1, generic_writes);
      take_turn();
      if (pending_pv) {
        wgmma_issue<false>(tiled_mma_o, tOrP, tOrVt(_, _, _, barriers.v.stage(i - 1)), tOrO);
      } else {
        warpgroup_commit_batch();
      }
      pass_turn();
      warpgroup_mma_done(tOrO, tOrP);
      barriers.v.release(i - 1);
    }
    // The listing pass (a cap past BoundedScores::fits): a consumer with a row whose sum shows no
    // term of 2^kLeastLog2 lists the tile, which the redo pass then writes again.
    if constexpr (sm90_lists_redo<kLoops>) {
      if (params.redo_pass == RedoPass::kList && has_keys) {
        auto keys = [&](int mi) {
          const int row = int(m_start) + get<0>(tScS_rc(mi, 0));
          return row < binfo.seqlen_q ? mask.key_count(row) : 0;
        };
        if (!named_barrier_all(kCheckBarrier + consumer, 128, softmax.sums_reach(keys)) && tidx % 128 == 0) {
          params.redo_tiles[1 + atomicAdd(params.redo_tiles, 1)] = t;
        }
      }
    }
    // Rows that saw no key leave the loop with O = 0 and a zero sum: finalize gives O = 0, LSE = +inf.
    auto lse = softmax.finalize(tOrO_rc, params.softmax_scale, Is_dropout ? params.dropout.rp : 1.f);
    if constexpr (Has_mods) {
      // The LSE in flash-attn's form: kAlibiCausal's (from alibi_col_ref) back to the symmetric
      // one's, then the causal one (from column 0) on causal rows without a left window.
      if (params.alibi_slopes) {
        const float slope = alibi_slope * params.softmax_scale;
        if constexpr (kAlibiCausal) {
          shift_alibi_lse(lse, tScS, int(m_start), binfo.seqlen_q, binfo.seqlen_k, -slope, alibi_col_ref);
        }
        if (alibi_causal_form(window)) shift_alibi_lse(lse, tScS, int(m_start), binfo.seqlen_q, binfo.seqlen_k, slope);
      }
    }
    if constexpr (Traits::kSeparateO) {
      sync_epilogue();  // this consumer is done reading its rows of the last tile's O from sO
    }  // else a consumer's rows of sO are its rows of sQ, which only its own (finished) MMAs read
    Tensor gO = gmem_row_tile<kBlockM, kHeadDim>(binfo.q_head<Element>(params.o, bidb, bidh), params.o.row_stride,
                                                 m_start);  // (kBlockM, kHeadDim)
    Tensor gLSE = make_tensor(make_gmem_ptr(params.softmax_lse_ptr + binfo.lse_offset(params, bidb, bidh) + m_start),
                              Shape<Int<kBlockM>>{});  // (kBlockM)
    write_o<Traits, Is_even_K, Traits::kConsumers>(tOrO, lse, gO, sO, gLSE, rows_left, params.head_dim, tidx,
                                                   sync_epilogue);
    if constexpr (Is_dropout) {
      if (params.o_residual.ptr != nullptr) {
        Tensor gOres = gmem_row_tile<kBlockM, kHeadDim>(binfo.q_head<Element>(params.o_residual, bidb, bidh),
                                                        params.o_residual.row_stride, m_start);  // (kBlockM, kHeadDim)
        sync_epilogue();  // this consumer is done reading its rows of O from sO
        store_tile_via_smem<typename Traits::SmemCopyAtomO, typename Traits::GmemTiledCopyO, Is_even_K,
                            Traits::kConsumers>(tiled_mma_o, rounding_residual<Element>(tOrO), sO, gOres, rows_left,
                                                params.head_dim, tidx, sync_epilogue);
      }
    }
    // This thread is done reading sO (Q's buffer): the producer may load the next Q. Where O is
    // in Q's buffer, its ordinary stores come before the next Q's TMA writes (the async proxy).
    if constexpr (!Traits::kSeparateO) cutlass::arch::fence_view_async_shared();
    if (!Traits::kSeparateO || !has_keys) barriers.q.release(q_use);
  }
  if (consumer == 0) take_turn();  // the last consumer's arrive after its last turn
}

template <class Traits, bool Is_causal, bool Is_even_K, Variant kVariant, bool Is_softcap>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flash_fwd_sm90_ws_kernel(__grid_constant__ const FwdParams params, __grid_constant__ const FwdWsTma<Traits> tma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool Has_mods = kVariant != Variant::kPlain;
  constexpr bool Is_dropout = kVariant == Variant::kDropout;
  static_assert(Has_mods || !Is_softcap);
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kConsumerThreads = Traits::kNConsumerThreads;
  extern __shared__ __align__(1024) char smem[];
  if constexpr (Is_dropout) record_rng_state(params.dropout);
  const FwdWsTileOrder tiles = FwdWsTileOrder::make(ceil_div(params.seqlen_q, kBlockM), params.batch, params.heads,
                                                    int64_t(params.seqlen_k) * kHeadDim * 2 * sizeof(Element), Is_causal);
  const Window window = params.kernel_window<Has_mods, Is_causal>();

  // Shared memory: Q's buffers, K's, V's, O where it has its own (each a whole number of swizzle
  // atoms; else O reuses Q's space), the barriers.
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k = smem_q + cosize_v<typename Traits::SmemLayoutQStages>;
  Element* smem_v = smem_k + cosize_v<typename Traits::SmemLayoutKV>;
  Element* smem_past_v = smem_v + cosize_v<typename Traits::SmemLayoutKV>;
  Element* smem_o = Traits::kSeparateO ? smem_past_v : smem_q;
  auto& barriers =
      *reinterpret_cast<FwdWsBarriersOf<Traits>*>(reinterpret_cast<char*>(smem_past_v) + Traits::kSmemOBytes);
  if (threadIdx.x == 0) {
    const int producers = params.ws_tma ? 1 : Traits::kNProducerThreads;  // the arrivals that fill a buffer
    barriers.q.init(producers, kConsumerThreads);
    barriers.k.init(producers, kConsumerThreads);
    barriers.v.init(producers, kConsumerThreads);
    cutlass::arch::ClusterBarrier::init(&barriers.tail, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < Traits::kNProducerThreads) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    fwd_ws_produce<Traits, Is_causal, Is_even_K>(params, tma, tiles, window, barriers, smem_q, smem_k, smem_v);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  fwd_ws_consume<Traits, Is_causal, Is_even_K, kVariant, Is_softcap>(params, tiles, window, barriers, smem_q, smem_k,
                                                                     smem_v, smem_o);
#else
  __trap();  // built without sm_90a (the dispatcher only picks this kernel on compute capability 9.0)
#endif
}

template <class Traits, bool kIsCausal, bool kIsEvenK, Variant kVariant, bool kIsSoftcap>
cudaError_t launch_fwd_sm90_ws_kernel(FwdParams const& params, cudaStream_t stream) {
  auto kernel = flash_fwd_sm90_ws_kernel<Traits, kIsCausal, kIsEvenK, kVariant, kIsSoftcap>;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (err != cudaSuccess) return err;
  // Persistent: one CTA per SM (or per tile, when there are fewer), each taking tiles until none
  // are left (tile_order.h).
  const int64_t n_tiles = int64_t(ceil_div(params.seqlen_q, Traits::kBlockM)) * params.batch * params.heads;
  if (n_tiles == 0) return cudaSuccess;
  const int grid = int(std::min<int64_t>(n_tiles, params.num_sms > 0 ? params.num_sms : 132));
  if (params.tile_counter == nullptr || n_tiles > INT32_MAX - grid) return cudaErrorInvalidValue;
  if (params.redo_pass != RedoPass::kNone &&
      (params.redo_tiles == nullptr || n_tiles * Traits::kConsumers > params.redo_capacity)) {
    return cudaErrorInvalidValue;  // the listing pass lists each consumer of a tile at most once
  }
  FwdParams p = params;
  FwdWsTma<Traits> tma{};
  const cudaError_t tma_err = tma_descriptors(params, p.ws_tma, tma);
  if (tma_err != cudaSuccess) return tma_err;
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, tma);
  return cudaPeekAtLastError();
}

// The kernel of the one online-softmax loop per tile (Sm90Loops::kPerTile), with two consumer
// warpgroups or, where it has them and they pay, three (fwd_sm90_ws_takes_three_consumers).
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant, bool kIsSoftcap>
cudaError_t launch_fwd_sm90_ws_per_tile(FwdParams const& params, cudaStream_t stream) {
  using Element = typename ElementOf<kDType>::type;
  if constexpr (fwd_sm90_ws_has_three_consumers(kHeadDim)) {
    if (fwd_sm90_ws_takes_three_consumers(params, kHeadDim, kVariant)) {
      using Traits = FwdKernelTraitsSm90Ws<kHeadDim, Element, kVariant, Sm90Loops::kPerTile, true>;
      return launch_fwd_sm90_ws_kernel<Traits, kIsCausal, kIsEvenK, kVariant, kIsSoftcap>(params, stream);
    }
  }
  using Traits = FwdKernelTraitsSm90Ws<kHeadDim, Element, kVariant>;
  return launch_fwd_sm90_ws_kernel<Traits, kIsCausal, kIsEvenK, kVariant, kIsSoftcap>(params, stream);
}

template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_fwd_sm90_ws(FwdParams const& params, cudaStream_t stream) {
  using Element = typename ElementOf<kDType>::type;
  if constexpr (kVariant != Variant::kPlain) {
    if (params.softcap > 0.f) {
      // The fixed offset where the cap fits, without and with ALiBi, in kernels of their own (their
      // tile: tile_size.h); larger caps take the same once each tile's running max reaches it, with
      // the online softmax until then (Sm90Loops' checked kernels), without and with ALiBi (session
      // 35, hdim 128, a cap of 60 at 16k tokens: the ALiBi loop's bias of 0 in every step cost 2 %
      // causal and 5 % non-causal).
      if constexpr (kFwdWsSoftcapSplit<Element, kVariant>) {
        auto launch = [&](auto loops, RedoPass pass = RedoPass::kNone) {
          using SplitTraits = FwdKernelTraitsSm90Ws<kHeadDim, Element, kVariant, decltype(loops)::value>;
          FwdParams p = params;
          p.redo_pass = pass;
          return launch_fwd_sm90_ws_kernel<SplitTraits, kIsCausal, kIsEvenK, kVariant, true>(p, stream);
        };
        using Loops = Sm90Loops;
        const bool has_alibi = params.alibi_slopes != nullptr;
        if (!BoundedScores::fits(params.softmax_scale_log2)) {
          // Up to a cap of 100, the fixed offset lists the tiles where it may not hold and the
          // checked kernel redoes them (BoundedScores::listed).
          if (params.redo_tiles != nullptr && BoundedScores::listed(params.softmax_scale_log2)) {
            const cudaError_t err = has_alibi ? launch(cute::C<Loops::kAlibiFixedOffset>{}, RedoPass::kList)
                                              : launch(cute::C<Loops::kNoBias>{}, RedoPass::kList);
            if (err != cudaSuccess) return err;
            return has_alibi ? launch(cute::C<Loops::kCheckedAlibi>{}, RedoPass::kRedo)
                             : launch(cute::C<Loops::kCheckedNoBias>{}, RedoPass::kRedo);
          }
          return has_alibi ? launch(cute::C<Loops::kCheckedAlibi>{}) : launch(cute::C<Loops::kCheckedNoBias>{});
        }
        if (has_alibi) return launch(cute::C<Loops::kAlibiFixedOffset>{});
        return launch(cute::C<Loops::kNoBias>{});
      } else {
        return launch_fwd_sm90_ws_per_tile<kDType, kHeadDim, kIsCausal, kIsEvenK, kVariant, true>(params, stream);
      }
    }
  }
  return launch_fwd_sm90_ws_per_tile<kDType, kHeadDim, kIsCausal, kIsEvenK, kVariant, false>(params, stream);
}

}  // namespace flash_attn_cute
