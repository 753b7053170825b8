// The Hopper forward (sm_90a): fwd_kernel.h's loop with warpgroup MMAs (wgmma). One warpgroup per
// CTA owns 64 query rows; S = Q K^T reads Q and K from shared memory, O += P V takes P from
// registers and V from shared memory. K and V stream through one buffer each, loaded by cp.async
// as in the SM80 kernel (so varlen, GQA, strides and head dims below the kernel's need nothing
// new): V(n) loads while S(n) is computed, K(n - 1) while P V(n) runs. Several CTAs share an SM
// (tile_size.h), so one's softmax runs beside another's MMAs. Every variant of fwd_kernel.h (plain,
// score mods, dropout with the score mods); split-KV runs on the SM80 kernels. run_fwd_sm90 hands
// long rows at head dims from 64 on to the warp-specialized kernel (fwd_kernel_sm90_ws.h).
#pragma once

#include <cute/tensor.hpp>

#include "block_info.h"
#include "dropout.h"
#include "fwd_api.h"
#include "fwd_epilogue.h"
#include "fwd_kernel_sm90_ws.h"
#include "fwd_mainloop.h"
#include "kernel_traits_sm90.h"
#include "launch.h"
#include "mask.h"
#include "params.h"
#include "softmax.h"
#include "utils.h"
#include "wgmma.h"

namespace flash_attn_cute {

using namespace cute;

// grid: (query row blocks, batch, heads), as flash_fwd_kernel. Is_softcap (score-mod and dropout
// variants): the softcap case is a kernel of its own, not a loop of the same kernel as in
// fwd_kernel.h: with both loops in one kernel, ptxas kept values of each live across the other and
// the hdim 128 kernels took 255 registers and spilled (174 and 190 registers for one loop each).
template <class Traits, bool Is_causal, bool Is_even_K, Variant kVariant, bool Is_softcap>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kCtasPerSm)
    flash_fwd_sm90_kernel(__grid_constant__ const FwdParams params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool Has_mods = kVariant != Variant::kPlain;
  constexpr bool Is_dropout = kVariant == Variant::kDropout;
  static_assert(Has_mods || !Is_softcap);
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  extern __shared__ __align__(1024) char smem[];
  const int tidx = threadIdx.x % Traits::kNThreads;
  const int m_blocks = int(gridDim.x);
  // Causal row blocks near the end of the sequence see the most keys: start them first.
  const int m_block = Is_causal ? m_blocks - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int bidb = blockIdx.y, bidh = blockIdx.z;
  if constexpr (Is_dropout) record_rng_state(params.dropout);

  const BlockInfo binfo(params, bidb);
  if (m_block * kBlockM >= binfo.seqlen_q) return;
  const Window window = params.kernel_window<Has_mods, Is_causal>();
  const NBlockRange range = fwd_n_block_range(m_block, kBlockM, kBlockN, binfo.seqlen_q, binfo.seqlen_k, window);
  const int bidh_kv = bidh / (params.heads / params.heads_k);
  const int rows_left = binfo.seqlen_q - m_block * kBlockM;

  // Global tiles. gK / gV carry a third mode over key blocks.
  auto tile_mk = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  Element* q_ptr = binfo.q_head<Element>(params.q, bidb, bidh);
  Element* o_ptr = binfo.q_head<Element>(params.o, bidb, bidh);
  const index_t m_start = index_t(m_block) * kBlockM;
  Tensor gQ = gmem_row_tile<kBlockM, kHeadDim>(q_ptr, params.q.row_stride, m_start);  // (kBlockM, kHeadDim)
  Tensor gO = gmem_row_tile<kBlockM, kHeadDim>(o_ptr, params.o.row_stride, m_start);  // (kBlockM, kHeadDim)
  auto key_blocks = [&](TensorView const& t) {  // (kBlockN, kHeadDim, n)
    return gmem_row_tiles<kBlockN, kHeadDim>(binfo.k_head<Element>(t, bidh_kv), t.row_stride, range.n_block_max);
  };
  Tensor gK = key_blocks(params.k);
  Tensor gV = key_blocks(params.v);
  Tensor gLSE = make_tensor(make_gmem_ptr(params.softmax_lse_ptr + binfo.lse_offset(params, bidb, bidh) + m_start),
                            Shape<Int<kBlockM>>{});  // (kBlockM)

  // Shared tiles: Q, then K, then V (each a whole number of swizzle atoms); O reuses Q's space.
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k = smem_q + cosize_v<typename Traits::SmemLayoutQ>;
  Element* smem_v = smem_k + cosize_v<typename Traits::SmemLayoutKV>;
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});    // (kBlockM, kHeadDim)
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});   // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutKV{});   // (kBlockN, kHeadDim)
  Tensor sVt = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutVt{});  // (kHeadDim, kBlockN)
  Tensor sO = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutO{});    // (kBlockM, kHeadDim)

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
  // Only the top key block can end past seqlen_k, and it always runs a masked step.
  auto load_kv = [&](auto const& tgmem, auto& tsmem, int n_block, auto is_masked) {
    copy_or_zero<decltype(is_masked)::value, !Is_even_K>(gmem_tiled_copy, tgmem(_, _, _, n_block), tsmem, tKVcKV,
                                                         binfo.seqlen_k - n_block * kBlockN, params.head_dim);
  };

  // MMA partitions: the warpgroup's shared-memory descriptors of Q, K and V, S and O in registers.
  typename Traits::TiledMmaS tiled_mma_s;
  typename Traits::TiledMma tiled_mma_o;
  auto thr_mma_s = tiled_mma_s.get_thread_slice(tidx);
  auto thr_mma_o = tiled_mma_o.get_thread_slice(tidx);
  Tensor tSrQ = thr_mma_s.partition_fragment_A(sQ);    // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma_s.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_K)
  Tensor tOrVt = thr_mma_o.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K)
  Tensor tOrO = partition_fragment_C(tiled_mma_o, tile_mk);  // (MMA, MMA_M, MMA_N)
  clear(tOrO);
  Tensor tScS = thr_mma_s.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));  // (MMA, MMA_M, MMA_N)
  CUTE_STATIC_ASSERT_V(size<2>(tSrQ) == size<2>(tSrK));              // Q K^T's k-slabs
  CUTE_STATIC_ASSERT_V(size<2>(tOrVt) * Int<16>{} == Int<kBlockN>{});  // P V's k-slabs: P's 16-key pairs

  Softmax<2 * decltype(size<1>(tOrO))::value, Traits::kLazyRescale> softmax;
  const FwdMask mask{binfo.seqlen_q, binfo.seqlen_k, window};
  const float alibi_slope = Has_mods ? params.alibi_slope_scaled(bidb, bidh) : 0.f;
  const bool has_alibi = alibi_slope != 0.f;  // no bias work without a slope
  const bool alibi_loop = sm90_alibi_loop<Is_softcap, Element>(has_alibi, params.softmax_scale_log2);
  if (sm90_fixes_offset<Is_softcap, Element>(alibi_loop)) {
    softmax.fix_offset(params.softmax_scale_log2, [](int) { return 0.f; });
  }
  Tensor tOrO_rc = make_tensor(tOrO.data(), acc_layout_rowcol(tOrO.layout()));  // (rows, head_dim cols)
  Tensor tScS_blocks = make_tensor(tScS.data(), acc_layout_mma_blocks(tScS.layout()));  // ((2, 2), MMA_M, N / 8)
  [[maybe_unused]] DropoutRng dropout_rng(0, 0, 0);
  if constexpr (Is_dropout) dropout_rng = make_dropout_rng(params.dropout);
  [[maybe_unused]] const uint32_t bh = uint32_t(bidb * params.heads + bidh);

  // One key block: S = Q K^T, mask, online softmax, O += P V. On entry K(n_block) is in flight;
  // on exit K(n_block - 1) is, if it exists. with_softcap, with_alibi: cute::true_type or false_type;
  // offset: StepOffset's kFixed or kOnline (fwd_walk_sm90).
  // The score mods as in fwd_kernel.h: without softcap, ALiBi (where the head has a slope) is S's
  // initial value and Q K^T accumulates onto it; softcap's tanh comes first, then the bias.
  auto fwd_step = [&](int n_block, auto is_masked, bool is_first, auto with_softcap, auto with_alibi,
                      auto offset) __attribute__((always_inline)) {
    constexpr bool kSoftcap = decltype(with_softcap)::value;
    constexpr bool kBiasFirst = !kSoftcap && decltype(with_alibi)::value;
    static_assert(decltype(offset)::value != StepOffset::kChecked);
    constexpr bool kFixedOffset = decltype(offset)::value == StepOffset::kFixed;
    Tensor tSrS = partition_fragment_C(tiled_mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    if constexpr (kBiasFirst) {
      fill_alibi(tSrS, tScS, int(m_start), n_block * kBlockN, binfo.seqlen_q, binfo.seqlen_k, alibi_slope);
    }
    if (is_first) {
      wait_copies_and_sync<1>();  // Q and K(n_block) have landed; V(n_block), copied with them, may not have
    } else {
      wait_copies_and_sync();  // K(n_block) has landed; P V(n_block + 1) is done with V's buffer
      load_kv(tVgV, tVsV, n_block, is_masked);
      cp_async_fence();
    }
    wgmma_issue<!kBiasFirst>(tiled_mma_s, tSrQ, tSrK, tSrS);
    // Dropout's words depend on the coordinates alone: drawn while Q K^T runs.
    [[maybe_unused]] const auto dropout_words =
        draw_dropout_words_before_wait<Is_dropout>(dropout_rng, tScS_blocks, bh, int(m_start), n_block * kBlockN);
    warpgroup_mma_done(tSrS);
    fwd_score_mods<kSoftcap, decltype(is_masked)::value, decltype(with_alibi)::value>(
        tSrS, tScS, int(m_start), n_block * kBlockN, mask, params.softcap, alibi_slope);
    wait_copies_and_sync();  // V(n_block) has landed; Q K^T is done with K's buffer
    if (n_block > range.n_block_min) {
      load_kv(tKgK, tKsK, n_block - 1, cute::false_type{});
      cp_async_fence();
    }
    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
    softmax.template rescale_o<decltype(is_masked)::value, Traits::fma_exp2_every(kSoftcap), kFixedOffset>(
        is_first, tSrS_rc, tOrO_rc, params.softmax_scale_log2);
    Tensor rP = convert_type<Element>(tSrS);                              // (MMA, MMA_M, MMA_N)
    if constexpr (Is_dropout) {
      Tensor rP_blocks = make_tensor(rP.data(), acc_layout_mma_blocks(rP.layout()));  // ((2, 2), MMA_M, N / 8)
      zero_dropped(rP_blocks, dropout_words, dropout_rng.threshold);
    }
    Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));  // (MMA, MMA_M, MMA_K)
    wgmma_gemm<false>(tiled_mma_o, tOrP, tOrVt, tOrO);
  };

  if (range.n_block_max > range.n_block_min) {
    copy_or_zero<true, !Is_even_K>(gmem_tiled_copy, tQgQ, tQsQ, tQcQ, rows_left, params.head_dim);
    load_kv(tKgK, tKsK, range.n_block_max - 1, cute::true_type{});
    cp_async_fence();
    // The first step's V too, in a group of its own: its latency overlaps K's and the first Q K^T
    // (short rows take one or two steps, where each copy's round trip weighs most).
    load_kv(tVgV, tVsV, range.n_block_max - 1, cute::true_type{});
    cp_async_fence();
    fwd_walk_sm90<Has_mods, Is_softcap, Element>(range, fwd_key_block_walk(range), alibi_loop, fwd_step);  // its loads: top-down
  }
  // Rows that saw no key leave the loop with O = 0 and a zero sum: finalize gives O = 0, LSE = +inf.
  auto lse = softmax.finalize(tOrO_rc, params.softmax_scale, Is_dropout ? params.dropout.rp : 1.f);
  if constexpr (Has_mods) {
    if (params.alibi_slopes && alibi_causal_form(window)) {
      shift_alibi_lse(lse, tScS, int(m_start), binfo.seqlen_q, binfo.seqlen_k, alibi_slope * params.softmax_scale);
    }
  }
  __syncthreads();  // every warp is done with Q's buffer, which O's tile reuses
  write_o<Traits, Is_even_K>(tOrO, lse, gO, sO, gLSE, rows_left, params.head_dim, tidx);
  if constexpr (Is_dropout) {
    if (params.o_residual.ptr != nullptr) {
      Tensor gOres = gmem_row_tile<kBlockM, kHeadDim>(binfo.q_head<Element>(params.o_residual, bidb, bidh),
                                                      params.o_residual.row_stride, m_start);  // (kBlockM, kHeadDim)
      __syncthreads();  // every thread is done reading O from sO
      store_tile_via_smem<typename Traits::SmemCopyAtomO, typename Traits::GmemTiledCopyO, Is_even_K>(
          tiled_mma_o, rounding_residual<Element>(tOrO), sO, gOres, rows_left, params.head_dim, tidx);
    }
  }
#else
  __trap();  // built without sm_90a (the dispatcher only picks this kernel on compute capability 9.0)
#endif
}

template <class Traits, bool kIsCausal, bool kIsEvenK, Variant kVariant, bool kIsSoftcap>
cudaError_t launch_fwd_sm90_kernel(FwdParams const& params, cudaStream_t stream) {
  auto kernel = flash_fwd_sm90_kernel<Traits, kIsCausal, kIsEvenK, kVariant, kIsSoftcap>;
  if (Traits::kSmemBytes >= kDefaultMaxDynamicSmemBytes) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(ceil_div(params.seqlen_q, Traits::kBlockM), params.batch, params.heads);
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
  return cudaPeekAtLastError();
}

template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_fwd_sm90_three_cta(FwdParams const& params, cudaStream_t stream) {
  using Traits = FwdKernelTraitsSm90<kHeadDim, kIsCausal, typename ElementOf<kDType>::type, kVariant>;
  if constexpr (kVariant != Variant::kPlain) {
    if (params.softcap > 0.f) return launch_fwd_sm90_kernel<Traits, kIsCausal, kIsEvenK, kVariant, true>(params, stream);
  }
  return launch_fwd_sm90_kernel<Traits, kIsCausal, kIsEvenK, kVariant, false>(params, stream);
}

// The warp-specialized kernel where fwd_sm90_takes_ws, else the three-CTA one. The variants built
// warp-specialized only (fwd_sm90_ws_only) come here only where it runs (the dispatcher's test).
template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK, Variant kVariant>
cudaError_t run_fwd_sm90(FwdParams const& params, cudaStream_t stream) {
  if constexpr (fwd_sm90_warp_specialized(kHeadDim)) {
    if (fwd_sm90_takes_ws(params, kHeadDim, kVariant)) {
      return run_fwd_sm90_ws<kDType, kHeadDim, kIsCausal, kIsEvenK, kVariant>(params, stream);
    }
  }
  if constexpr (fwd_sm90_ws_only(kHeadDim, kVariant)) {
    return cudaErrorNotSupported;
  } else {
    return run_fwd_sm90_three_cta<kDType, kHeadDim, kIsCausal, kIsEvenK, kVariant>(params, stream);
  }
}

}  // namespace flash_attn_cute
