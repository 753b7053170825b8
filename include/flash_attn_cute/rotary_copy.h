// The KV cache's row copies (flash_attn_with_kvcache): new keys and values appended into the cache
// at cache_seqlens (dense, batch-indexed or paged), and q, each with rotary embedding applied on
// the way when cos / sin are given; all of them in one launch (a decode step's append is one kernel
// before the attention's). The params and the launcher's declaration; the kernel is in
// rotary_copy_kernel.h.
#pragma once

#include <cuda_runtime.h>

#include "block_info.h"
#include "params.h"

namespace flash_attn_cute {

// One tensor's rows: src (batch, rows, heads, head_dim) into dst.
struct RowCopy {
  TensorView src;  // (batch, rows, heads, head_dim)
  TensorView dst;  // dense: (dst batch, dst_rows, heads, head_dim); paged: (pages, page_size, heads, head_dim)
  int rows = 0, heads = 0;

  // Row i of sequence b goes to row row_base[b] + i of dst entry dst_batch_idx[b] (or b); rows that
  // land outside [0, dst_rows), bad batch indices and bad pages are skipped.
  const int* row_base = nullptr;  // nullptr: 0
  int dst_rows = 0;
  const int* dst_batch_idx = nullptr;
  int dst_batch = 0;  // dst's first dimension (entries or pages)
  const int* block_table = nullptr;
  index_t block_table_batch_stride = 0;
  int page_size = 0;

  // Rotary embedding on the first rotary_dim columns (0: a plain copy). cos / sin: (seqlen_ro,
  // rotary_dim / 2) contiguous, in the element type. Row i of sequence b sits at position
  // pos_base[b] + (pos_per_row ? i : 0); positions outside [0, seqlen_ro) leave the row unrotated.
  void const* cos = nullptr;
  void const* sin = nullptr;
  int rotary_dim = 0;
  int seqlen_ro = 0;
  bool interleaved = true;  // rotate pairs (2j, 2j + 1), else (j, j + rotary_dim / 2)
  const int* pos_base = nullptr;
  bool pos_per_row = true;
};

inline constexpr int kMaxRowCopies = 3;  // a decode step's keys, values and (rotated) q

// The copies of one launch: copy[0, copies), every one of them of this batch, head dim and dtype.
struct RowCopyParams {
  RowCopy copy[kMaxRowCopies];
  int copies = 0;
  int batch = 0, head_dim = 0;
  DType dtype = DType::kBFloat16;
  // When set: rows_end[b] = copy[0].row_base[b] + copy[0].rows, the length of sequence b's cache
  // after the append (the attention's seqused_k), written by the launch that appends.
  int* rows_end = nullptr;
};

// Which elements a rotation pairs: element j of an interleaved vector with its neighbour, or the
// vector at column c with the one at c + rotary_dim / 2. Host-and-device: the unit tests read it.
FLASH_HOST_DEVICE constexpr bool rotary_vector_is_owner(int col, int rotary_dim, bool interleaved) {
  return interleaved || col >= rotary_dim || col < rotary_dim / 2;
}

// Launches rotary_copy_kernel (defined in csrc/rotary_copy.cu).
cudaError_t run_rotary_copy(RowCopyParams const& params, cudaStream_t stream);

}  // namespace flash_attn_cute
