// The FA2 forward kernel: one CTA per (query row block, batch, head). Q stays in shared memory;
// K and V blocks stream through one shared buffer each, the next K block loading while the current
// block's softmax and P V run. The loop body is written once (fwd_step) and runs first over the
// few masked key blocks at the top of the range, then mask-free over the rest.
#pragma once

#include <cute/tensor.hpp>

#include "block_info.h"
#include "combine.h"
#include "dropout.h"
#include "fwd_epilogue.h"
#include "fwd_mainloop.h"
#include "kernel_traits.h"
#include "launch.h"
#include "mask.h"
#include "params.h"
#include "softmax.h"
#include "split_kv.h"
#include "utils.h"

namespace flash_attn_cute {

using namespace cute;

// Is_even_K: head_dim == kHeadDim, so no column predicates. kVariant: plain, score mods (softcap,
// ALiBi, local windows) or dropout (params.h). Is_split: the split-KV kernel. Its warps each run
// split `split` of params.num_splits, in their own shared memory (Traits is one warp's), and write
// a partial (O, LSE) for the combine kernel (split_kv.h); or, when the CTA's warps hold all the
// splits (split_warps: `warps`, 1 outside the split kernel), merge them there; or, when num_splits
// is 1, write O and LSE themselves. It also reads paged K / V.
template <class Traits, bool Is_causal, bool Is_even_K, bool Is_split, Variant kVariant>
__device__ __forceinline__ void fwd_row_block(FwdParams const& params, char* smem, int m_block, int bidb,
                                              int bidh, int split, int warps) {
  constexpr bool Has_mods = kVariant != Variant::kPlain;
  constexpr bool Is_dropout = kVariant == Variant::kDropout;
  static_assert(!(Is_dropout && Is_split), "the split-KV kernel has no dropout");
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  // The split kernel: this warp's lane. The modulo also tells ptxas that tidx < kNThreads, which
  // took the plain kernel at head dim 128 from 80 spill instructions to 5 (forward 3-5 % faster).
  const int tidx = threadIdx.x % Traits::kNThreads;
  char* const smem_own = Is_split ? smem + threadIdx.x / Traits::kNThreads * Traits::kSmemBytes : smem;
  // A split-kernel warp waits only for itself.
  auto barrier = [] {
    if constexpr (Is_split) {
      __syncwarp();
    } else {
      __syncthreads();
    }
  };

  const BlockInfo binfo(params, bidb);
  if (m_block * kBlockM >= binfo.seqlen_q) return;
  const Window window = params.kernel_window<Has_mods, Is_causal>();
  NBlockRange range = fwd_n_block_range(m_block, kBlockM, kBlockN, binfo.seqlen_q, binfo.seqlen_k, window);
  if constexpr (Is_split) range = split_n_block_range(range, params.num_splits, split);
  const int bidh_kv = bidh / (params.heads / params.heads_k);
  const int rows_left = binfo.seqlen_q - m_block * kBlockM;

  // Global tiles. gK / gV carry a third mode over key blocks.
  auto tile_mk = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  Element* q_ptr = binfo.q_head<Element>(params.q, bidb, bidh);
  Element* o_ptr = binfo.q_head<Element>(params.o, bidb, bidh);
  Element* k_ptr = binfo.k_head<Element>(params.k, bidh_kv);
  Element* v_ptr = binfo.k_head<Element>(params.v, bidh_kv);
  const index_t m_start = index_t(m_block) * kBlockM;
  Tensor gQ = gmem_row_tile<kBlockM, kHeadDim>(q_ptr, params.q.row_stride, m_start);  // (kBlockM, kHeadDim)
  Tensor gO = gmem_row_tile<kBlockM, kHeadDim>(o_ptr, params.o.row_stride, m_start);  // (kBlockM, kHeadDim)
  // (kBlockN, kHeadDim, n)
  Tensor gK = gmem_row_tiles<kBlockN, kHeadDim>(k_ptr, params.k.row_stride, range.n_block_max);
  Tensor gV = gmem_row_tiles<kBlockN, kHeadDim>(v_ptr, params.v.row_stride, range.n_block_max);
  Tensor gLSE = make_tensor(make_gmem_ptr(params.softmax_lse_ptr + binfo.lse_offset(params, bidb, bidh) + m_start),
                            Shape<Int<kBlockM>>{});  // (kBlockM)

  // Shared tiles: Q, then K, then V; O reuses Q's space in the epilogue.
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem_own)), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});         // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});         // (kBlockN, kHeadDim)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});                   // (kHeadDim, kBlockN)
  Tensor sVtNoSwizzle = make_tensor(sV.data().get(), typename Traits::SmemLayoutVtNoSwizzle{});
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});                     // (kBlockM, kHeadDim)

  // Global -> shared copies and the (row, col) of every vector they move.
  typename Traits::GmemTiledCopyQKV gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tidx);
  Tensor tQgQ = gmem_thr_copy.partition_S(gQ);  // (CPY, CPY_M, CPY_K)
  Tensor tQsQ = gmem_thr_copy.partition_D(sQ);  // (CPY, CPY_M, CPY_K)
  Tensor tKgK = gmem_thr_copy.partition_S(gK);  // (CPY, CPY_N, CPY_K, n)
  Tensor tKsK = gmem_thr_copy.partition_D(sK);  // (CPY, CPY_N, CPY_K)
  Tensor tVgV = gmem_thr_copy.partition_S(gV);  // (CPY, CPY_N, CPY_K, n)
  Tensor tVsV = gmem_thr_copy.partition_D(sV);  // (CPY, CPY_N, CPY_K)
  Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(tile_mk));  // (CPY, CPY_M, CPY_K) -> (m, k)
  Tensor tKVcKV = gmem_thr_copy.partition_S(
      make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));  // (CPY, CPY_N, CPY_K) -> (n, k)
  // Only the top key block can end past seqlen_k, and it always runs a masked step: the
  // mask-free steps skip the row predicate.
  // head_ptr / view: head bidh_kv of K or V; a paged cache finds each row's page from the block table.
  // When the page size is a multiple of kBlockN, a key block lies in one page: one table lookup for
  // the block, then the dense copy (a page outside the cache reads as zeros).
  auto load_kv = [&](auto const& tgmem, auto& tsmem, Element const* head_ptr, TensorView const& view, int n_block,
                     auto is_masked) {
    constexpr bool kCheckRows = decltype(is_masked)::value;
    const int rows_valid = binfo.seqlen_k - n_block * kBlockN;
    if constexpr (Is_split) {
      if (params.block_table != nullptr && params.page_size % kBlockN == 0) {
        const index_t offset = paged_row_offset(params, view, bidb, n_block * kBlockN);
        Tensor gBlock = gmem_row_tile<kBlockN, kHeadDim>(head_ptr + (offset < 0 ? 0 : offset), view.row_stride,
                                                         0);  // (kBlockN, kHeadDim)
        copy_or_zero<true, !Is_even_K>(gmem_tiled_copy, gmem_thr_copy.partition_S(gBlock), tsmem, tKVcKV,
                                       offset < 0 ? 0 : rows_valid, params.head_dim);
        return;
      }
      if (params.block_table != nullptr) {
        auto row_offset = [&](int row) { return paged_row_offset(params, view, bidb, n_block * kBlockN + row); };
        copy_rows_or_zero<kCheckRows, !Is_even_K>(gmem_tiled_copy, head_ptr, row_offset, tsmem, tKVcKV, rows_valid,
                                                  params.head_dim);
        return;
      }
    }
    copy_or_zero<kCheckRows, !Is_even_K>(gmem_tiled_copy, tgmem(_, _, _, n_block), tsmem, tKVcKV, rows_valid,
                                         params.head_dim);
  };

  // MMA partitions: S = Q K^T, O = P V.
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tidx);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);            // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma.partition_fragment_B(sK);            // (MMA, MMA_N, MMA_K)
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);  // (MMA, MMA_K, MMA_N)
  Tensor tOrO = partition_fragment_C(tiled_mma, tile_mk);    // (MMA, MMA_M, MMA_K)
  clear(tOrO);
  auto smem_tiled_copy_Q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_tiled_copy_K = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_tiled_copy_V = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  Tensor tSsQ = smem_tiled_copy_Q.get_thread_slice(tidx).partition_S(sQ);    // (CPY, CPY_M, CPY_K)
  Tensor tSsK = smem_tiled_copy_K.get_thread_slice(tidx).partition_S(sK);    // (CPY, CPY_N, CPY_K)
  Tensor tOsVt = smem_tiled_copy_V.get_thread_slice(tidx).partition_S(sVt);  // (CPY, CPY_K, CPY_N)
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));  // (MMA, MMA_M, MMA_N)

  Softmax<2 * decltype(size<1>(tOrO))::value, Traits::kLazyRescale> softmax;
  const FwdMask mask{binfo.seqlen_q, binfo.seqlen_k, window};
  const float alibi_slope = Has_mods ? params.alibi_slope_scaled(bidb, bidh) : 0.f;
  Tensor tOrO_rc = make_tensor(tOrO.data(), acc_layout_rowcol(tOrO.layout()));  // (rows, head_dim cols)
  [[maybe_unused]] DropoutRng dropout_rng(0, 0, 0);
  if constexpr (Is_dropout) dropout_rng = make_dropout_rng(params.dropout);
  [[maybe_unused]] const uint32_t bh = uint32_t(bidb * params.heads + bidh);

  // One key block: S = Q K^T, mask, online softmax, O += P V. On entry K(n_block) is in flight;
  // on exit K(n_block - 1) is, if it exists. with_softcap: std::true_type or std::false_type.
  // ALiBi (the symmetric form; the shift after finalize gives the causal form's LSE) where the head
  // has a slope (a branch per block, uniform over the CTA). Without softcap the bias is S's initial
  // value, written while the tiles load; softcap's tanh comes before the bias, which is then added
  // to its result.
  auto fwd_step = [&](int n_block, auto is_masked, bool is_first, auto with_softcap) __attribute__((always_inline)) {
    constexpr bool kSoftcap = decltype(with_softcap)::value;
    Tensor tSrS = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    if (!kSoftcap && alibi_slope != 0.f) {
      fill_alibi(tSrS, tScS, int(m_start), n_block * kBlockN, binfo.seqlen_q, binfo.seqlen_k, alibi_slope);
    } else {
      clear(tSrS);
    }
    cp_async_wait<0>();
    barrier();  // K(n_block) has landed; every warp is done reading V(n_block + 1)
    load_kv(tVgV, tVsV, v_ptr, params.v, n_block, is_masked);
    cp_async_fence();
    gemm_ss(tiled_mma, tSrS, tSrQ, tSrK, tSsQ, tSsK, smem_tiled_copy_Q, smem_tiled_copy_K, tidx);
    // The softcap loop adds the bias (a slope of 0 without one).
    fwd_score_mods<kSoftcap, decltype(is_masked)::value, true>(tSrS, tScS, int(m_start), n_block * kBlockN, mask,
                                                                params.softcap, alibi_slope);
    cp_async_wait<0>();
    barrier();  // V(n_block) has landed; every warp is done reading K(n_block) and Q
    if (n_block > range.n_block_min) {
      load_kv(tKgK, tKsK, k_ptr, params.k, n_block - 1, cute::false_type{});
      cp_async_fence();
    }
    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
    softmax.template rescale_o<decltype(is_masked)::value>(is_first, tSrS_rc, tOrO_rc, params.softmax_scale_log2);
    Tensor rP = convert_type<Element>(tSrS);
    if constexpr (Is_dropout) zero_dropped(rP, dropout_rng, tScS, bh, int(m_start), n_block * kBlockN);
    Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));  // (MMA, MMA_M, MMA_K)
    gemm_loading(tiled_mma, tOrO, tOrP, tOrVt, tOrVt, tOsVt, smem_tiled_copy_V, tidx);
  };

  if (range.n_block_max > range.n_block_min) {
    copy_or_zero<true, !Is_even_K>(gmem_tiled_copy, tQgQ, tQsQ, tQcQ, rows_left, params.head_dim);
    load_kv(tKgK, tKsK, k_ptr, params.k, range.n_block_max - 1, cute::true_type{});
    cp_async_fence();
    fwd_mainloop<Has_mods>(range, params.softcap, fwd_step);
  }
  // Rows that saw no key leave the loop with O = 0 and a zero sum: finalize gives O = 0, LSE = +inf.
  auto lse = softmax.finalize(tOrO_rc, params.softmax_scale, Is_dropout ? params.dropout.rp : 1.f);
  if constexpr (Has_mods) {
    if (params.alibi_slopes && alibi_causal_form(window)) {
      shift_alibi_lse(lse, tScS, int(m_start), binfo.seqlen_q, binfo.seqlen_k, alibi_slope * params.softmax_scale);
    }
  }
  if (Is_split && warps > 1) {
    // The partial goes where Q, K and V were: (kBlockM, kHeadDim) fp32, then kBlockM LSEs.
    constexpr int kOOffset = 0;
    constexpr int kLseOffset = kOOffset + kBlockM * kHeadDim * sizeof(float);
    static_assert(!Is_split || kLseOffset + kBlockM * sizeof(float) <= Traits::kSmemBytes);
    __syncwarp();  // this warp is done reading Q, K and V
    write_o_partial<Traits>(tOrO, lse, reinterpret_cast<float*>(smem_own + kOOffset),
                            reinterpret_cast<float*>(smem_own + kLseOffset), rows_left, tidx);
    __syncthreads();  // every warp's partial is in shared memory
    merge_warp_splits<Element, kHeadDim, kBlockM>(smem, Traits::kSmemBytes, kOOffset, kLseOffset, warps,
                                                  o_ptr + m_start * params.o.row_stride, params.o.row_stride,
                                                  gLSE.data().get(), rows_left, params.head_dim);
  } else if (Is_split && params.num_splits > 1) {
    const index_t row0 = split * params.split_stride + binfo.lse_offset(params, bidb, bidh) + m_start;
    write_o_partial<Traits>(tOrO, lse, params.oaccum_ptr + row0 * kHeadDim, params.lseaccum_ptr + row0, rows_left,
                            tidx);
  } else {
    write_o<Traits, Is_even_K>(tOrO, lse, gO, sO, gLSE, rows_left, params.head_dim, tidx);
    if constexpr (Is_dropout) {
      if (params.o_residual.ptr != nullptr) {
        Tensor gOres = gmem_row_tile<kBlockM, kHeadDim>(binfo.q_head<Element>(params.o_residual, bidb, bidh),
                                                        params.o_residual.row_stride, m_start);  // (kBlockM, kHeadDim)
        __syncthreads();  // every thread is done reading O from sO
        store_tile_via_smem<typename Traits::SmemCopyAtomO, typename Traits::GmemTiledCopyO, Is_even_K>(
            typename Traits::TiledMma{}, rounding_residual<Element>(tOrO), sO, gOres, rows_left, params.head_dim,
            tidx);
      }
    }
  }
}

// grid: (query row blocks [x CTA splits, splits slowest], batch, heads). The split kernel's CTA has
// split_warps(num_splits) warps, each with Traits::kSmemBytes of shared memory, and split_ctas(num_splits)
// CTA splits.
template <class Traits, bool Is_causal, bool Is_even_K, bool Is_split, Variant kVariant>
__global__ void __launch_bounds__(Traits::kNThreads * (Is_split ? kMaxSplitWarps : 1), 1)
    flash_fwd_kernel(__grid_constant__ const FwdParams params) {
  extern __shared__ __align__(128) char smem[];
  if constexpr (!small_smem_kernel_built<Traits::kSmallSmem>()) {
    __trap();
  } else {
    if constexpr (kVariant == Variant::kDropout) record_rng_state(params.dropout);
    // A split kernel launched dependent (split_launch_dependent) may start while the kernel before it
    // (a decode step's last, often the previous call's combine) finishes, and waits for its memory
    // here (a no-op after an ordinary launch). The combine kernel, launched dependent, may start once
    // every split CTA is running.
    if constexpr (Is_split) {
      wait_for_prior_grid();
      allow_dependent_launch();
    }
    const int warps = Is_split ? split_warps(params.num_splits) : 1;
    const int m_blocks = Is_split ? int(gridDim.x) / split_ctas(params.num_splits) : int(gridDim.x);
    const int split = Is_split ? int(blockIdx.x) / m_blocks * warps + int(threadIdx.x) / Traits::kNThreads : 0;
    const int m_idx = Is_split ? int(blockIdx.x) % m_blocks : int(blockIdx.x);
    // Causal row blocks near the end of the sequence see the most keys: start them first so the
    // short ones fill the tail of the grid.
    const int m_block = Is_causal ? m_blocks - 1 - m_idx : m_idx;
    fwd_row_block<Traits, Is_causal, Is_even_K, Is_split, kVariant>(params, smem, m_block, blockIdx.y, blockIdx.z,
                                                                    split, warps);
  }
}

}  // namespace flash_attn_cute
