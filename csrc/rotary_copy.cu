// The launcher of the KV cache's row copy kernel (rotary_copy_kernel.h): its one translation unit,
// compiled with the kernel instantiations (csrc/features.py lists it).
#include "flash_attn_cute/rotary_copy_kernel.h"

namespace flash_attn_cute {

cudaError_t run_rotary_copy(RowCopyParams const& params, cudaStream_t stream) {
  const int64_t vectors = int64_t(params.rows) * params.heads * (params.head_dim / row_copy::kElemsPerVector);
  if (vectors == 0 || params.batch == 0) return cudaSuccess;
  const dim3 grid(unsigned((vectors + row_copy::kThreads - 1) / row_copy::kThreads), params.batch);
  if (params.dtype == DType::kFloat16) {
    rotary_copy_kernel<cutlass::half_t><<<grid, row_copy::kThreads, 0, stream>>>(params);
  } else {
    rotary_copy_kernel<cutlass::bfloat16_t><<<grid, row_copy::kThreads, 0, stream>>>(params);
  }
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
