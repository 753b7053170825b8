// TMA loads of Q, K and V for the warp-specialized Hopper forward (fwd_kernel_sm90_ws.h), where
// they fit (fwd_ws_tma_fits): the descriptors, built on the host by the launch and passed to the
// kernel as a __grid_constant__ parameter. Elsewhere that kernel's producer loads with cp.async.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>  // after cute/tensor.hpp, which it needs
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "fwd_api.h"
#include "params.h"

namespace flash_attn_cute {

using namespace cute;

// The driver's cuTensorMapEncodeTiled, looked up once; null (reported once) where the driver has none.
inline void* tensor_map_encoder() {
  static void* const encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                                             &status);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &status);
#endif
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // not the launch's error: it falls back to cp.async
      std::fprintf(stderr, "flash_attn_cute: no cuTensorMapEncodeTiled (error %d, status %d): cp.async loads\n",
                   int(err), int(status));
      return static_cast<void*>(nullptr);
    }
    return fn;
  }();
  return encode;
}

// A TMA tensor's extents: (rows, head_dim, heads, batch).
using TmaShape = decltype(make_shape(0, 0, 0, 0));

// Whether the driver encodes the tensor `view` of 16-bit elements and that shape with boxes of
// box_rows x box_cols, as CuTe's make_tma_copy will. CuTe's own call cannot fail quietly: its report
// goes through std::cerr, and with NDEBUG it carries on with an unset descriptor. So the launch
// checks each descriptor first and falls back to cp.async where one fails (the first failure is
// reported with its shape).
inline bool tensor_map_encodes(TensorView const& view, TmaShape const& shape, bool is_fp16, int box_rows,
                               int box_cols) {
  void* const encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  CUtensorMap map;
  const int rows = get<0>(shape), head_dim = get<1>(shape), heads = get<2>(shape), batch = get<3>(shape);
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(view.row_stride) * 2, cuuint64_t(view.head_stride) * 2,
                                 cuuint64_t(view.batch_stride) * 2};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1}, elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = reinterpret_cast<EncodeTiled>(encode)(
      &map, is_fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, view.ptr, dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  static std::atomic_flag reported = ATOMIC_FLAG_INIT;  // the first failure only: a caller may repeat it per step
  if (r != CUDA_SUCCESS && !reported.test_and_set()) {
    std::fprintf(stderr,
                 "flash_attn_cute: cuTensorMapEncodeTiled failed (%d) for shape (%d, %d, %d, %d), strides "
                 "(%lld, %lld, %lld), base %p: cp.async loads\n",
                 int(r), rows, head_dim, heads, batch, (long long)view.row_stride, (long long)view.head_stride,
                 (long long)view.batch_stride, view.ptr);
  }
  return r == CUDA_SUCCESS;
}

// A tensor of 16-bit elements as TMA sees it: (rows, head_dim, heads, batch) with the real head_dim,
// so that columns and rows past the tensor's end land as zeros, as cp.async's zero fill leaves them.
template <class Element>
auto tma_gmem(TensorView const& view, TmaShape const& shape) {
  return make_tensor(make_gmem_ptr(static_cast<Element const*>(view.ptr)), shape,
                     make_stride(view.row_stride, _1{}, view.head_stride, view.batch_stride));
}
// Q's extents (dO's too), which the descriptors are built with and the kernels index: varlen, the
// packed rows as one batch entry (tma_view_q), each sequence's rows offset into them by the loads.
CUTE_HOST_DEVICE TmaShape tma_shape_q(FwdParams const& p) {
  return p.cu_seqlens_q ? make_shape(int(p.total_q), p.head_dim, p.heads, 1)
                        : make_shape(p.seqlen_q, p.head_dim, p.heads, p.batch);
}
// Zeroes rows [rows, kRows) of a (kRows, kHeadDim) tile of shared memory in a swizzled layout, 16
// bytes a store (the swizzles move 16-byte chunks whole), by n_threads threads, this one `thread`.
template <class SmemTile>
__device__ __forceinline__ void zero_rows_from(SmemTile tile, int rows, int thread, int n_threads) {
  constexpr int kRows = decltype(size<0>(tile))::value;
  constexpr int kChunks = decltype(size<1>(tile))::value / 8;
  for (int c = thread; c < (kRows - rows) * kChunks; c += n_threads) {
    *reinterpret_cast<uint4*>(&tile(rows + c / kChunks, c % kChunks * 8)) = make_uint4(0, 0, 0, 0);
  }
}

// One thread: by TMA, row block `block` (Tile's rows) of head `head` of a sequence whose rows start at
// row_start of batch entry `batch` (varlen: the packed rows, entry 0) of the descriptor's tensor
// (`shape`, its extents), into smem, `barrier` told of the bytes.
template <class Tile, class Copy, class SmemTensor>
__device__ __forceinline__ void tma_load_row_block(Copy const& tma, TmaShape const& shape, int row_start, int head,
                                                   int batch, int block, SmemTensor const& smem, uint64_t& barrier) {
  Tensor rows = domain_offset(make_coord(row_start, _0{}), tma.get_tma_tensor(shape)(_, _, head, batch));
  Tensor g = local_tile(rows, Tile{}, make_coord(block, _0{}));  // (Tile's rows, head_dim)
  auto cta_tma = tma.get_slice(_0{});
  copy(tma.with(barrier), cta_tma.partition_S(g), cta_tma.partition_D(smem));
}

// The forward's descriptors (each tensor as tma_gmem sees it).
template <class Traits>
struct FwdWsTma {
  using Element = typename Traits::Element;
  using TileQ = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>;
  using TileKV = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>;
  static constexpr uint32_t kBytesQ = Traits::kBlockM * Traits::kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = Traits::kBlockN * Traits::kHeadDim * sizeof(Element);
  static constexpr int kBoxCols = Traits::kHeadDim % 64 == 0 ? 64 : 32;  // the swizzle atom's row (kernel_traits_sm90.h)
  static_assert(sizeof(Element) == 2);

  // K's and V's extents (Q's: tma_shape_q), which the descriptors are built with and the producer
  // indexes: one place for both. Varlen, the packed rows as one batch entry (tma_view_k); else the
  // batch extent, which the glue sets in kv_batch for caches only.
  CUTE_HOST_DEVICE static TmaShape shape_kv(FwdParams const& p) {
    if (p.cu_seqlens_k) return make_shape(int(p.total_k), p.head_dim, p.heads_k, 1);
    return make_shape(p.seqlen_k, p.head_dim, p.heads_k, p.kv_batch > 0 ? p.kv_batch : p.batch);
  }

  static auto gmem(TensorView const& view, TmaShape const& shape) { return tma_gmem<Element>(view, shape); }
  using CopyQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, gmem(TensorView{}, TmaShape{}), typename Traits::SmemLayoutQ{},
                                       TileQ{}, _1{}));
  using CopyKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, gmem(TensorView{}, TmaShape{}),
                                        typename Traits::SmemLayoutKVStage{}, TileKV{}, _1{}));
  CopyQ q;
  CopyKV k, v;

  // Whether the TMA loads can run for these params: they fit and the driver encodes all three.
  static bool usable(FwdParams const& p) {
    constexpr bool kFp16 = std::is_same_v<Element, cutlass::half_t>;
    return fwd_ws_tma_fits(p) &&
           tensor_map_encodes(tma_view_q(p.q, p), tma_shape_q(p), kFp16, Traits::kBlockM, kBoxCols) &&
           tensor_map_encodes(tma_view_k(p.k, p), shape_kv(p), kFp16, Traits::kBlockN, kBoxCols) &&
           tensor_map_encodes(tma_view_k(p.v, p), shape_kv(p), kFp16, Traits::kBlockN, kBoxCols);
  }

  static FwdWsTma make(FwdParams const& p) {
    auto kv = [&](TensorView const& view) {
      return make_tma_copy(SM90_TMA_LOAD{}, gmem(tma_view_k(view, p), shape_kv(p)), typename Traits::SmemLayoutKVStage{},
                           TileKV{}, _1{});
    };
    return {make_tma_copy(SM90_TMA_LOAD{}, gmem(tma_view_q(p.q, p), tma_shape_q(p)), typename Traits::SmemLayoutQ{},
                          TileQ{}, _1{}),
            kv(p.k), kv(p.v)};
  }
};

// FLASH_ATTN_CUTE_SM90_TMA: unset, TMA loads where they can run; "0", cp.async loads everywhere (A / B
// timing, tests); "require", a launch that cannot use them fails (tests: that TMA really ran).
enum class TmaLoads { kAuto, kOff, kRequire };
inline TmaLoads tma_loads_setting() {
  const char* value = std::getenv("FLASH_ATTN_CUTE_SM90_TMA");
  if (value == nullptr) return TmaLoads::kAuto;
  return std::strcmp(value, "0") == 0 ? TmaLoads::kOff : std::strcmp(value, "require") == 0 ? TmaLoads::kRequire
                                                                                              : TmaLoads::kAuto;
}

// A launch's descriptors (Tma: FwdWsTma or BwdSm90Tma) as FLASH_ATTN_CUTE_SM90_TMA says: `on` where
// the TMA loads run; cudaErrorNotSupported where "require" cannot be met.
template <class Tma, class Params>
cudaError_t tma_descriptors(Params const& params, bool& on, Tma& tma) {
  const TmaLoads setting = tma_loads_setting();
  on = setting != TmaLoads::kOff && Tma::usable(params);
  if (setting == TmaLoads::kRequire && !on) return cudaErrorNotSupported;
  if (on) tma = Tma::make(params);
  return cudaSuccess;
}

}  // namespace flash_attn_cute
