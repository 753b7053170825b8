// The launcher of the KV cache's row copy kernel (rotary_copy_kernel.h): its one translation unit,
// compiled with the kernel instantiations (csrc/features.py lists it).
#include <algorithm>

#include "flash_attn_cute/rotary_copy_kernel.h"

namespace flash_attn_cute {

cudaError_t run_rotary_copy(RowCopyParams const& params, cudaStream_t stream) {
  int64_t vectors = 0;
  for (int c = 0; c < params.copies; ++c) {
    vectors = std::max(vectors, int64_t(params.copy[c].rows) * params.copy[c].heads *
                                    (params.head_dim / row_copy::kElemsPerVector));
  }
  // rows_end is written by the grid's first block of each sequence.
  if (params.batch == 0 || params.copies == 0 || (vectors == 0 && params.rows_end == nullptr)) return cudaSuccess;
  const dim3 grid(unsigned(std::max<int64_t>((vectors + row_copy::kThreads - 1) / row_copy::kThreads, 1)),
                  params.batch, params.copies);
  if (params.dtype == DType::kFloat16) {
    rotary_copy_kernel<cutlass::half_t><<<grid, row_copy::kThreads, 0, stream>>>(params);
  } else {
    rotary_copy_kernel<cutlass::bfloat16_t><<<grid, row_copy::kThreads, 0, stream>>>(params);
  }
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
