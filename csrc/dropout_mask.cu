// The dropout keep mask as a tensor (dropout.h): the definition the attention kernels apply, entry
// by entry. Its one translation unit, compiled with the kernel instantiations (csrc/features.py).
#include <algorithm>

#include "flash_attn_cute/dropout.h"

namespace flash_attn_cute {
namespace {

constexpr int kMaskThreads = 256;

// grid: (entry blocks, heads, batch); each thread walks the (row, key) entries of one head.
__global__ void __launch_bounds__(kMaskThreads) dropout_mask_kernel(__grid_constant__ const DropoutMaskParams params) {
  const int b = blockIdx.z, h = blockIdx.y;
  const DropoutRng rng = make_dropout_rng(params.dropout);
  const bool varlen = params.cu_seqlens_q != nullptr;
  const int len_q = varlen ? params.cu_seqlens_q[b + 1] - params.cu_seqlens_q[b] : params.seqlen_q;
  const int len_k = varlen ? params.cu_seqlens_k[b + 1] - params.cu_seqlens_k[b] : params.seqlen_k;
  const int64_t entries = int64_t(params.seqlen_q) * params.seqlen_k;
  bool* out = params.out + (int64_t(b) * params.heads + h) * entries;
  for (int64_t e = int64_t(blockIdx.x) * kMaskThreads + threadIdx.x; e < entries;
       e += int64_t(gridDim.x) * kMaskThreads) {
    const int i = int(e / params.seqlen_k), j = int(e % params.seqlen_k);
    out[e] = i < len_q && j < len_k && rng.keep(uint32_t(b * params.heads + h), i, j);
  }
}

}  // namespace

cudaError_t run_dropout_mask(DropoutMaskParams const& params, cudaStream_t stream) {
  const int64_t entries = int64_t(params.seqlen_q) * params.seqlen_k;
  if (entries == 0 || params.batch == 0 || params.heads == 0) return cudaSuccess;
  const dim3 grid(unsigned(std::min<int64_t>((entries + kMaskThreads - 1) / kMaskThreads, 4096)), params.heads,
                  params.batch);
  dropout_mask_kernel<<<grid, kMaskThreads, 0, stream>>>(params);
  return cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
