// The Hopper forward (sm_90a): fwd_kernel.h's loop with warpgroup MMAs (wgmma). One warpgroup per
// CTA owns 64 query rows; S = Q K^T reads Q and K from shared memory, O += P V takes P from
// registers and V from shared memory. K and V stream through one buffer each, loaded by cp.async
// as in the SM80 kernel (so varlen, GQA, strides and head dims below the kernel's need nothing
// new): V(n) loads while S(n) is computed, K(n - 1) while P V(n) runs. Two CTAs share an SM, so
// one's softmax runs beside the other's MMAs. The plain variant only (causal, full, causal with a
// left window); the score mods, dropout and split-KV run on the SM80 kernels.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "block_info.h"
#include "fwd_epilogue.h"
#include "kernel_traits_sm90.h"
#include "mask.h"
#include "params.h"
#include "softmax.h"
#include "utils.h"

namespace flash_attn_cute {

using namespace cute;

// acc (+)= A B by one warpgroup MMA per k16 slab, A from shared memory (descriptors) or registers.
// Returns when the MMAs are done (acc is ready, their shared memory free again).
template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorAcc>
__device__ __forceinline__ void wgmma_gemm(TiledMma& tiled_mma, TensorA& tCrA, TensorB const& tCrB, TensorAcc& acc) {
  constexpr bool kARegs = !std::is_same_v<typename TensorA::value_type, GmmaDescriptor>;
  if constexpr (kARegs) warpgroup_fence_operand(tCrA);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  tiled_mma.accumulate_ = kZeroInit ? SM90::GMMA::ScaleOut::Zero : SM90::GMMA::ScaleOut::One;
#pragma unroll
  for (int k = 0; k < size<2>(tCrA); ++k) {
    gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
    tiled_mma.accumulate_ = SM90::GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  if constexpr (kARegs) warpgroup_fence_operand(tCrA);
}

// cp.async's shared-memory writes are ordinary ones; the warpgroup MMAs read through the async
// proxy: each thread fences its landed copies before the barrier that publishes them.
__device__ __forceinline__ void wait_copies_and_sync() {
  cp_async_wait<0>();
  cutlass::arch::fence_view_async_shared();
  __syncthreads();
}

// grid: (query row blocks, batch, heads), as flash_fwd_kernel.
template <class Traits, bool Is_causal, bool Is_even_K>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kCtasPerSm)
    flash_fwd_sm90_kernel(__grid_constant__ const FwdParams params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
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

  const BlockInfo binfo(params, bidb);
  if (m_block * kBlockM >= binfo.seqlen_q) return;
  const Window window{Is_causal ? params.window.left : -1, Is_causal ? 0 : -1};
  const NBlockRange range = fwd_n_block_range(m_block, kBlockM, kBlockN, binfo.seqlen_q, binfo.seqlen_k, window);
  const int bidh_kv = bidh / (params.heads / params.heads_k);
  const int rows_left = binfo.seqlen_q - m_block * kBlockM;

  // Global tiles. gK / gV carry a third mode over key blocks.
  auto tile_mk = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  Element* q_ptr = static_cast<Element*>(params.q.ptr) + binfo.q_offset(params.q, bidb, bidh);
  Element* o_ptr = static_cast<Element*>(params.o.ptr) + binfo.q_offset(params.o, bidb, bidh);
  const index_t m_start = index_t(m_block) * kBlockM;
  Tensor gQ = make_tensor(make_gmem_ptr(q_ptr + m_start * params.q.row_stride), tile_mk,
                          make_stride(params.q.row_stride, _1{}));  // (kBlockM, kHeadDim)
  Tensor gO = make_tensor(make_gmem_ptr(o_ptr + m_start * params.o.row_stride), tile_mk,
                          make_stride(params.o.row_stride, _1{}));  // (kBlockM, kHeadDim)
  auto kv_blocks = [&](TensorView const& view) {
    Element* ptr = static_cast<Element*>(view.ptr) + binfo.k_offset(view, bidh_kv);
    return make_tensor(make_gmem_ptr(ptr), make_shape(Int<kBlockN>{}, Int<kHeadDim>{}, range.n_block_max),
                       make_stride(view.row_stride, _1{}, view.row_stride * kBlockN));  // (kBlockN, kHeadDim, n)
  };
  Tensor gK = kv_blocks(params.k);
  Tensor gV = kv_blocks(params.v);
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

  Softmax<2 * decltype(size<1>(tOrO))::value, Traits::kLazyRescale> softmax;
  const FwdMask mask{binfo.seqlen_q, binfo.seqlen_k, window};
  Tensor tOrO_rc = make_tensor(tOrO.data(), acc_layout_rowcol(tOrO.layout()));  // (rows, head_dim cols)

  // One key block: S = Q K^T, mask, online softmax, O += P V. On entry K(n_block) is in flight;
  // on exit K(n_block - 1) is, if it exists.
  auto fwd_step = [&](int n_block, auto is_masked, bool is_first) __attribute__((always_inline)) {
    Tensor tSrS = partition_fragment_C(tiled_mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    wait_copies_and_sync();  // K(n_block) has landed; P V(n_block + 1) is done with V's buffer
    load_kv(tVgV, tVsV, n_block, is_masked);
    cp_async_fence();
    wgmma_gemm<true>(tiled_mma_s, tSrQ, tSrK, tSrS);
    if constexpr (decltype(is_masked)::value) mask.apply(tSrS, tScS, int(m_start), n_block * kBlockN);
    wait_copies_and_sync();  // V(n_block) has landed; Q K^T is done with K's buffer
    if (n_block > range.n_block_min) {
      load_kv(tKgK, tKsK, n_block - 1, cute::false_type{});
      cp_async_fence();
    }
    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
    constexpr bool kCheckInf = decltype(is_masked)::value;
    if (is_first) {
      softmax.template softmax_rescale_o<true, kCheckInf>(tSrS_rc, tOrO_rc, params.softmax_scale_log2);
    } else {
      softmax.template softmax_rescale_o<false, kCheckInf>(tSrS_rc, tOrO_rc, params.softmax_scale_log2);
    }
    Tensor rP = convert_type<Element>(tSrS);
    Tensor tOrP = make_tensor(rP.data(), acc_layout_as_A(rP.layout()));  // (MMA, MMA_M, MMA_K)
    wgmma_gemm<false>(tiled_mma_o, tOrP, tOrVt, tOrO);
  };

  if (range.n_block_max > range.n_block_min) {
    copy_or_zero<true, !Is_even_K>(gmem_tiled_copy, tQgQ, tQsQ, tQcQ, rows_left, params.head_dim);
    load_kv(tKgK, tKsK, range.n_block_max - 1, cute::true_type{});
    cp_async_fence();
    for (int n_block = range.n_block_max - 1; n_block >= range.n_block_min; --n_block) {
      const bool is_first = n_block == range.n_block_max - 1;
      if (is_first || range.is_masked(n_block)) {
        fwd_step(n_block, cute::true_type{}, is_first);
      } else {
        fwd_step(n_block, cute::false_type{}, false);
      }
    }
  }
  // Rows that saw no key leave the loop with O = 0 and a zero sum: finalize gives O = 0, LSE = +inf.
  auto lse = softmax.finalize(tOrO_rc, params.softmax_scale, 1.f);
  __syncthreads();  // every warp is done with Q's buffer, which O's tile reuses
  write_o<Traits, Is_even_K>(tOrO, lse, gO, sO, gLSE, rows_left, params.head_dim, tidx);
#else
  __trap();  // built without sm_90a (the dispatcher only picks this kernel on compute capability 9.0)
#endif
}

template <DType kDType, int kHeadDim, bool kIsCausal, bool kIsEvenK>
cudaError_t run_fwd_sm90(FwdParams const& params, cudaStream_t stream) {
  using Traits = FwdKernelTraitsSm90<kHeadDim, kIsCausal, typename ElementOf<kDType>::type>;
  auto kernel = flash_fwd_sm90_kernel<Traits, kIsCausal, kIsEvenK>;
  if (Traits::kSmemBytes >= 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(ceil_div(params.seqlen_q, Traits::kBlockM), params.batch, params.heads);
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
