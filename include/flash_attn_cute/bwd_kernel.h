// The FA2 backward kernel: one CTA per (key block, batch, KV head). K and V stay in shared memory,
// dK and dV in registers, while the CTA walks every query head of its KV head's group and, for
// each, the query row blocks that see its keys. Per row block (bwd_step):
//   S = Q K^T, P = exp2(S * scale * log2(e) - LSE * log2(e))   (recomputed from the forward's LSE)
//   dP = dO V^T, dS = P * (dP - D)                              (D = rowsum(dO * O), preprocessed)
//   dV += P^T dO, dK += dS^T Q,  dQaccum += dS K                (fp32 reductions: bwd_epilogue.h)
// (with dropout, P carries the mask in its sign: see bwd_step).
// Q and dO are double-buffered: the next row block loads during this one (in the small tiles,
// bwd_tile_shape's, single-buffered from head dim 128: it loads after this one). With
// Traits::kVInRegs V moves into registers at the start and P and dS take its shared memory. The
// causal diagonal and a key block past seqlen_k run the masked step; the rest run mask-free, with
// the same body.
#pragma once

#include <cute/tensor.hpp>

#include "block_info.h"
#include "bwd_epilogue.h"
#include "bwd_kernel_traits.h"
#include "dropout.h"
#include "launch.h"
#include "mask.h"
#include "params.h"
#include "softmax.h"
#include "utils.h"

namespace flash_attn_cute {

using namespace cute;

template <class Traits, bool Is_causal, bool Is_even_K, Variant kVariant>
__device__ __forceinline__ void bwd_col_block(BwdParams const& params, char* smem, int n_block, int bidb,
                                              int bidh_kv) {
  constexpr bool Has_mods = kVariant != Variant::kPlain;
  constexpr bool Is_dropout = kVariant == Variant::kDropout;
  static_assert(!(Is_dropout && Traits::kVInRegs), "dropout draws 32 key columns a warp; the V-in-registers tile has 16");
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kSlot = Traits::kSmemQElems;
  constexpr int kQSlots = Traits::kQSlots;
  const int tidx = threadIdx.x;

  const Window window = params.kernel_window<Has_mods, Is_causal>();
  const BlockInfo binfo(params, bidb);
  if (n_block * kBlockN >= binfo.seqlen_k) return;
  const MBlockRange range =
      bwd_m_block_range(n_block, kBlockM, kBlockN, binfo.seqlen_q, binfo.seqlen_k, window);
  const int group = params.heads / params.heads_k;
  const index_t n_start = index_t(n_block) * kBlockN;
  const int keys_left = binfo.seqlen_k - int(n_start);
  // Deterministic: the rotated walk below and the dQ order that goes with it (block_info.h).
  const int n_count = ceil_div(binfo.seqlen_k, kBlockN);
  const bool rotated = dq_rotated(params.dq_rotate, window, n_count, ceil_div(binfo.seqlen_q, kBlockM));

  auto tile_nk = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  auto tile_mk = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  auto k_side_tile = [&](TensorView const& t) {  // (kBlockN, kHeadDim) of this CTA's KV head
    return gmem_row_tile<kBlockN, kHeadDim>(binfo.k_head<Element>(t, bidh_kv), t.row_stride, n_start);
  };
  auto q_side_tile = [&](TensorView const& t, int bidh, int m_block) {  // (kBlockM, kHeadDim)
    return gmem_row_tile<kBlockM, kHeadDim>(binfo.q_head<Element>(t, bidb, bidh), t.row_stride,
                                            index_t(m_block) * kBlockM);
  };

  // Shared memory: Q x kQSlots, dO x kQSlots, K, V, P, dS (inside V with kVInRegs; then LSE and D,
  // the dQ tile's hand-on), and the transposed views the GEMMs read.
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(sQ.data() + kQSlots * kSlot, typename Traits::SmemLayoutQ{});        // (kBlockM, kHeadDim)
  Tensor sK = make_tensor(sdO.data() + kQSlots * kSlot, typename Traits::SmemLayoutKV{});       // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});               // (kBlockN, kHeadDim)
  Tensor sP = make_tensor(sV.data() + (Traits::kVInRegs ? 0 : size(sV)), typename Traits::SmemLayoutPdS{});  // (kBlockM, kBlockN)
  Tensor sdS = make_tensor(sP.data() + size(sP), typename Traits::SmemLayoutPdS{});             // (kBlockM, kBlockN)
  DqAccumulator<kBlockM, kHeadDim, Traits::kNWarps, Traits::kDqVec> dq_accum{
      reinterpret_cast<DqHandOn*>(smem + Traits::kSmemDQHandOnOffset)};
  dq_accum.init(dq_next_key_block(n_block, n_count, rotated));
  Tensor sQt = make_tensor(sQ.data(), typename Traits::SmemLayoutQt{});                         // (kHeadDim, kBlockM)
  Tensor sdOt = make_tensor(sdO.data(), typename Traits::SmemLayoutQt{});                       // (kHeadDim, kBlockM)
  Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});                         // (kHeadDim, kBlockN)
  Tensor sPt = make_tensor(sP.data(), typename Traits::SmemLayoutPdSt{});                       // (kBlockN, kBlockM)
  Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutPdSt{});                     // (kBlockN, kBlockM)
  Tensor sQtNoSwizzle = make_tensor(sQ.data().get(), typename Traits::SmemLayoutQtNoSwizzle{});
  Tensor sKtNoSwizzle = make_tensor(sK.data().get(), typename Traits::SmemLayoutKtNoSwizzle{});
  Tensor sPdStNoSwizzle = make_tensor(sP.data().get(), typename Traits::SmemLayoutPdStNoSwizzle{});

  // Global -> shared.
  typename Traits::GmemTiledCopy gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tidx);
  Tensor tQsQ = gmem_thr_copy.partition_D(sQ);     // (CPY, CPY_M, CPY_K)
  Tensor tdOsdO = gmem_thr_copy.partition_D(sdO);  // (CPY, CPY_M, CPY_K)
  Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(tile_mk));    // (CPY, CPY_M, CPY_K) -> (m, k)
  Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(tile_nk));  // (CPY, CPY_N, CPY_K) -> (n, k)
  // LSE and D of a row block: (slot, LSE / D, kBlockM) floats, loaded with its Q and dO.
  float* sLseD = reinterpret_cast<float*>(smem + Traits::kSmemLseDOffset);
  // Rows past seqlen_q (and columns past head_dim) load as zeros: P and dS are 0 there. Only the
  // last row block can end past seqlen_q: the others skip the row checks. A row block's loads go
  // out in two parts at two points of a step, Q with LSE and D, then dO: issued at once, the
  // copies' late-released address registers stalled the instructions after them (6.7 % of the
  // stall samples at head dim 64). The dO part commits the group.
  auto load_rows = [&](TensorView const& view, int bidh, int m_block, auto& tsmem) {
    const int rows_left = binfo.seqlen_q - m_block * kBlockM;
    Tensor tgmem = gmem_thr_copy.partition_S(q_side_tile(view, bidh, m_block));
    if (rows_left >= kBlockM) {
      copy_or_zero<false, !Is_even_K>(gmem_tiled_copy, tgmem, tsmem, tQcQ, rows_left, params.head_dim);
    } else {
      copy_or_zero<true, !Is_even_K>(gmem_tiled_copy, tgmem, tsmem, tQcQ, rows_left, params.head_dim);
    }
  };
  auto load_q_lse_d = [&](int bidh, int m_block, int slot) {
    const int rows_left = binfo.seqlen_q - m_block * kBlockM;
    if (tidx < 2 * kBlockM && tidx % kBlockM < rows_left) {
      const index_t row = binfo.lse_offset(params, bidb, bidh) + m_block * kBlockM + tidx % kBlockM;
      float const& src = tidx < kBlockM ? params.softmax_lse_ptr[row] : params.dsoftmax_sum_ptr[row];
      SM80_CP_ASYNC_CACHEALWAYS<float>::copy(src, sLseD[slot * 2 * kBlockM + tidx]);
    }
    Tensor tsmem = in_slot(tQsQ, slot, kSlot);
    load_rows(params.q, bidh, m_block, tsmem);
  };
  auto load_do = [&](int bidh, int m_block, int slot) {
    Tensor tsmem = in_slot(tdOsdO, slot, kSlot);
    load_rows(params.dout, bidh, m_block, tsmem);
    cp_async_fence();
  };

  // S = Q K^T and dP = dO V^T.
  typename Traits::TiledMmaSdP mma_sdp;
  auto thr_sdp = mma_sdp.get_thread_slice(tidx);
  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);     // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);     // (MMA, MMA_N, MMA_K)
  Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO);  // (MMA, MMA_M, MMA_K)
  Tensor tdPrV = thr_sdp.partition_fragment_B(sV);    // (MMA, MMA_N, MMA_K)
  auto copy_sdp_A = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_sdp);
  auto copy_sdp_B = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma_sdp);
  Tensor tSsQ = copy_sdp_A.get_thread_slice(tidx).partition_S(sQ);     // (CPY, CPY_M, CPY_K)
  Tensor tdPsdO = copy_sdp_A.get_thread_slice(tidx).partition_S(sdO);  // (CPY, CPY_M, CPY_K)
  Tensor tSsK = copy_sdp_B.get_thread_slice(tidx).partition_S(sK);     // (CPY, CPY_N, CPY_K)
  Tensor tdPsV = copy_sdp_B.get_thread_slice(tidx).partition_S(sV);    // (CPY, CPY_N, CPY_K)
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));  // (MMA, MMA_M, MMA_N)
  Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));                  // (rows, cols)
  auto copy_pds = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
  Tensor tPsP = copy_pds.get_thread_slice(tidx).partition_D(sP);     // (CPY, CPY_M, CPY_N)
  Tensor tdSsdS = copy_pds.get_thread_slice(tidx).partition_D(sdS);  // (CPY, CPY_M, CPY_N)

  // dV += P^T dO and dK += dS^T Q: both operands read transposed.
  typename Traits::TiledMmadKV mma_dkv;
  auto thr_dkv = mma_dkv.get_thread_slice(tidx);
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPdStNoSwizzle);   // (MMA, MMA_N, MMA_M)
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sQtNoSwizzle);    // (MMA, MMA_K, MMA_M)
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sPdStNoSwizzle);  // (MMA, MMA_N, MMA_M)
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQtNoSwizzle);     // (MMA, MMA_K, MMA_M)
  auto copy_dkv_A = make_tiled_copy_A(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
  auto copy_dkv_B = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
  Tensor tdVsPt = copy_dkv_A.get_thread_slice(tidx).partition_S(sPt);    // (CPY, CPY_N, CPY_M)
  Tensor tdKsdSt = copy_dkv_A.get_thread_slice(tidx).partition_S(sdSt);  // (CPY, CPY_N, CPY_M)
  Tensor tdVsdOt = copy_dkv_B.get_thread_slice(tidx).partition_S(sdOt);  // (CPY, CPY_K, CPY_M)
  Tensor tdKsQt = copy_dkv_B.get_thread_slice(tidx).partition_S(sQt);    // (CPY, CPY_K, CPY_M)
  Tensor acc_dk = partition_fragment_C(mma_dkv, tile_nk);  // (MMA, MMA_N, MMA_K)
  Tensor acc_dv = partition_fragment_C(mma_dkv, tile_nk);  // (MMA, MMA_N, MMA_K)
  clear(acc_dk);
  clear(acc_dv);

  // dQ = dS K.
  typename Traits::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tidx);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);        // (MMA, MMA_M, MMA_N)
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKtNoSwizzle);  // (MMA, MMA_K, MMA_N)
  auto copy_dq_A = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_dq);
  auto copy_dq_B = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dq);
  Tensor tdQsdS = copy_dq_A.get_thread_slice(tidx).partition_S(sdS);  // (CPY, CPY_M, CPY_N)
  Tensor tdQsKt = copy_dq_B.get_thread_slice(tidx).partition_S(sKt);  // (CPY, CPY_K, CPY_N)

  const FwdMask mask{binfo.seqlen_q, binfo.seqlen_k, window};
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;
  // Dropout: the forward's mask, redrawn from its rng_state.
  [[maybe_unused]] DropoutRng dropout_rng(0, 0, 0);
  if constexpr (Is_dropout) dropout_rng = make_dropout_rng(params.dropout);
  [[maybe_unused]] const float keep_prob = 1.f - params.dropout.p;

  // One query row block of query head bidh. On entry its Q, dO, LSE and D are in flight into
  // `slot`; the next row block (if any) starts loading into the other slot, or with one slot into
  // the same once this block is done with it.
  auto bwd_step = [&](int bidh, int m_block, int slot, auto is_masked, bool has_next, int next_bidh,
                      int next_m_block) __attribute__((always_inline)) {
    const int m_start = m_block * kBlockM;
    cp_async_wait<0>();
    // Q, dO, LSE, D of this block have landed; every warp is done with the other slot, P and dS.
    dq_accum.barrier();
    dq_accum.poll_turn(params.deterministic ? dq_semaphore_at(params, bidb, bidh, m_block, kBlockM) : nullptr);
    if (kQSlots == 2 && has_next) load_q_lse_d(next_bidh, next_m_block, slot ^ 1);
    // This thread's rows of LSE (in log2 units) and D. Rows past seqlen_q get LSE = +inf: P = 0.
    Tensor lse_log2 = make_tensor<float>(Shape<Int<kRows>>{});
    Tensor dsum = make_tensor<float>(Shape<Int<kRows>>{});
#pragma unroll
    for (int mi = 0; mi < kRows; ++mi) {
      const int row = get<0>(tScS_rc(mi, 0));
      const bool in_seq = m_start + row < binfo.seqlen_q;
      lse_log2(mi) = in_seq ? sLseD[slot * 2 * kBlockM + row] * float(M_LOG2E) : INFINITY;
      dsum(mi) = in_seq ? sLseD[slot * 2 * kBlockM + kBlockM + row] : 0.f;
      if constexpr (Is_dropout) dsum(mi) *= keep_prob;
    }

    Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    clear(tSrS);
    gemm_ss(mma_sdp, tSrS, tSrQ, tSrK, in_slot(tSsQ, slot, kSlot), tSsK, copy_sdp_A, copy_sdp_B, tidx);
    if (kQSlots == 2 && has_next) load_do(next_bidh, next_m_block, slot ^ 1);
    [[maybe_unused]] const float alibi_slope = Has_mods ? params.alibi_slope_scaled(bidb, bidh) : 0.f;
    if constexpr (Has_mods) {
      if (params.softcap > 0.f) apply_softcap(tSrS, params.softcap);
      if (params.alibi_slopes) {
        apply_alibi(tSrS, tScS, m_start, int(n_start), binfo.seqlen_q, binfo.seqlen_k, alibi_causal_form(window),
                    alibi_slope);
      }
    }
    if constexpr (decltype(is_masked)::value) mask.apply(tSrS, tScS, m_start, int(n_start));
    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
    probs_from_lse(tSrS_rc, lse_log2, params.softmax_scale_log2);
    // With dropout, O = (P * Z) V with Z = keep / (1 - p): dS = P * (Z * dP - D), dV += (P * Z)^T dO.
    // The kernel forms dS' = P * (keep * dP - (1 - p) D) and dV' += (P * keep)^T dO, and the
    // epilogues scale dK, dQ and dV by the 1 / (1 - p) left out (BwdParams::ds_scale, dv_scale).
    if constexpr (Is_dropout) {
      negate_dropped(tSrS, dropout_rng, tScS, uint32_t(bidb * params.heads + bidh), m_start, int(n_start));
    }
    Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    clear(tdPrdP);
    if constexpr (Traits::kVInRegs) {
      gemm_loading(mma_sdp, tdPrdP, tdPrdO, tdPrV, tdPrdO, in_slot(tdPsdO, slot, kSlot), copy_sdp_A, tidx);
    } else {
      gemm_ss(mma_sdp, tdPrdP, tdPrdO, tdPrV, in_slot(tdPsdO, slot, kSlot), tdPsV, copy_sdp_A, copy_sdp_B, tidx);
    }
    Tensor tdPrdP_rc = make_tensor(tdPrdP.data(), acc_layout_rowcol(tdPrdP.layout()));  // (rows, cols)
    dscores<Is_dropout>(tdPrdP_rc, tSrS_rc, dsum);
    if constexpr (Has_mods) {
      if (params.softcap > 0.f) {
        // Through the cap: dS *= 1 - tanh^2, tanh recovered from P.
        softcap_dscores<Is_dropout>(tdPrdP_rc, tSrS_rc, lse_log2, params.softmax_scale_log2, tScS, m_start,
                                    int(n_start), binfo.seqlen_q, binfo.seqlen_k, alibi_causal_form(window),
                                    alibi_slope);
      }
    }
    Tensor rP = convert_type<Element>(tSrS);
    if constexpr (Is_dropout) relu_pairs(rP);
    Tensor rdS = convert_type<Element>(tdPrdP);
    copy(copy_pds, copy_pds.get_thread_slice(tidx).retile_S(rP), tPsP);
    copy(copy_pds, copy_pds.get_thread_slice(tidx).retile_S(rdS), tdSsdS);
    dq_accum.wait_turn(n_block);
    dq_accum.barrier();  // P and dS are in shared memory

    gemm_ss(mma_dkv, acc_dv, tdVrPt, tdVrdOt, tdVsPt, in_slot(tdVsdOt, slot, kSlot), copy_dkv_A, copy_dkv_B, tidx);
    Tensor acc_dq = partition_fragment_C(mma_dq, tile_mk);  // (MMA, MMA_M, MMA_K)
    clear(acc_dq);
    gemm_ss(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, copy_dq_A, copy_dq_B, tidx);
    float* gdQaccum = params.dq_accum_ptr + binfo.dq_accum_offset(params, bidb, bidh) +
                      m_start * params.dq_accum_row_stride;
    dq_accum.add(acc_dq, gdQaccum);
    gemm_ss(mma_dkv, acc_dk, tdKrdSt, tdKrQt, tdKsdSt, in_slot(tdKsQt, slot, kSlot), copy_dkv_A, copy_dkv_B, tidx);
    if constexpr (kQSlots == 1) {
      if (has_next) {
        dq_accum.barrier();  // every warp is done with Q and dO
        load_q_lse_d(next_bidh, next_m_block, 0);
        load_do(next_bidh, next_m_block, 0);
      }
    }
  };

  if (range.m_block_max > range.m_block_min) {
    Tensor tKgK = gmem_thr_copy.partition_S(k_side_tile(params.k));  // (CPY, CPY_N, CPY_K)
    Tensor tVgV = gmem_thr_copy.partition_S(k_side_tile(params.v));  // (CPY, CPY_N, CPY_K)
    copy_or_zero<true, !Is_even_K>(gmem_tiled_copy, tKgK, gmem_thr_copy.partition_D(sK), tKVcKV, keys_left,
                                   params.head_dim);
    copy_or_zero<true, !Is_even_K>(gmem_tiled_copy, tVgV, gmem_thr_copy.partition_D(sV), tKVcKV, keys_left,
                                   params.head_dim);
    // By default every CTA walks its row blocks upwards, so the CTAs of one head read the same Q
    // and dO tiles at about the same time, from L2. (Starting each CTA's walk at a different row
    // block, to spread the dQ additions, measured 2-3 % slower on H200: head dim 64 non-causal, 256
    // causal; walking downwards, 2-5 % slower at head dim 128 causal, 8k-16k tokens.)
    // Deterministic, they walk downwards from the last row block, so that key block n reaches each
    // row block no later than key block n + 1, whose dQ tile comes after its own (block_info.h;
    // measured +3 % at head dims 128 and 256 causal, 8k-16k tokens); the rotated walk starts key
    // block n at the n-th row block from the last and wraps around. The i-th row block of the walk
    // is worked out at each step from registers the loop holds anyway: one more live register
    // spills the head dim 64 kernel.
    auto row_block = [&](int i) { return bwd_walk_row_block(i, range, n_block, params.deterministic, rotated); };
    const int bidh_begin = bidh_kv * group;
    const int bidh_end = bidh_begin + group;
    load_q_lse_d(bidh_begin, row_block(0), 0);
    load_do(bidh_begin, row_block(0), 0);
    if constexpr (Traits::kVInRegs) {
      // V into registers for the whole CTA (the first step's barrier comes before any P or dS store).
      cp_async_wait<0>();
      __syncthreads();
      copy(copy_sdp_B, tdPsV, copy_sdp_B.get_thread_slice(tidx).retile_D(tdPrV));
    }
    int slot = 0;
    for (int bidh = bidh_begin; bidh < bidh_end; ++bidh) {
      for (int i = 0; i < range.m_block_max - range.m_block_min; ++i, slot ^= kQSlots - 1) {
        const int m_block = row_block(i);
        const bool last_of_head = i + 1 == range.m_block_max - range.m_block_min;
        const bool has_next = !last_of_head || bidh + 1 < bidh_end;
        const int next_bidh = last_of_head ? bidh + 1 : bidh;
        const int next_m_block = row_block(last_of_head ? 0 : i + 1);
        if (range.is_masked(m_block)) {
          bwd_step(bidh, m_block, slot, cute::true_type{}, has_next, next_bidh, next_m_block);
        } else {
          bwd_step(bidh, m_block, slot, cute::false_type{}, has_next, next_bidh, next_m_block);
        }
      }
    }
  }
  // dK and dV, also when no query row saw these keys (then they are 0).
  // Every warp is done reading K and V (and the last dQ tile's turn is handed on).
  dq_accum.barrier();
  Tensor gdK = k_side_tile(params.dk);
  Tensor gdV = k_side_tile(params.dv);
  write_kv_tile<Traits, Is_even_K>(mma_dkv, acc_dk, params.ds_scale(), sK, gdK, keys_left, params.head_dim, tidx);
  write_kv_tile<Traits, Is_even_K>(mma_dkv, acc_dv, params.dv_scale(), sV, gdV, keys_left, params.head_dim, tidx);
}

template <class Traits, bool Is_causal, bool Is_even_K, Variant kVariant>
__global__ void __launch_bounds__(Traits::kNThreads, 1) flash_bwd_kernel(__grid_constant__ const BwdParams params) {
  extern __shared__ __align__(128) char smem[];
  if constexpr (!small_smem_kernel_built<Traits::kSmallSmem>()) {
    __trap();
  } else {
    // The CTA's tile in either order, then one call of the (inlined) column block: a call per order
    // compiled the whole backward twice (the SM80 backward files took 1.5x as long, session 27).
    FwdWsTile tile{int(blockIdx.z), int(blockIdx.y), int(blockIdx.x)};
    if (!bwd_grid_key_block_major(Is_causal, params.deterministic, params.dq_rotate)) {
      tile = bwd_cta_tile<Traits::kHeadDim, Traits::kBlockN, typename Traits::Element, Is_causal>(params, blockIdx.x);
    }
    bwd_col_block<Traits, Is_causal, Is_even_K, kVariant>(params, smem, tile.m_block, tile.bidb, tile.bidh);
  }
}

}  // namespace flash_attn_cute
