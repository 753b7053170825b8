// Where one (batch, head) problem lives and which key blocks a query row block visits.
// Host-and-device, no CuTe: the C++ unit tests exercise it on the CPU.
#pragma once

#include "params.h"

#if defined(__CUDACC__)
#define FLASH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASH_HOST_DEVICE inline
#endif

namespace flash_attn_cute {

FLASH_HOST_DEVICE constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Sequence lengths and element offsets of one batch entry (fixed-length or varlen, with the
// optional per-sequence key counts, left padding and batch indirection of FwdParams).
struct BlockInfo {
  int seqlen_q;
  int seqlen_k;
  index_t q_row_start;  // first row of this sequence in a (total, heads, dim) varlen tensor, else 0
  index_t k_row_start;  // first key row: cu_seqlens_k[b] in varlen mode, plus leftpad_k[b]
  int k_batch;          // the batch entry of k / v (0 in varlen mode and for a paged cache)
  bool is_varlen;

  // In varlen mode a sequence longer than max_seqlen_q / max_seqlen_k (a caller error that cannot be
  // checked without reading the device's cu_seqlens) is cut to it: the grids and scratch buffers
  // are sized by the maxima, so the kernels never index past them.
  FLASH_HOST_DEVICE BlockInfo(FwdParams const& params, int bidb)
      : seqlen_q(params.cu_seqlens_q ? clamp(params.cu_seqlens_q[bidb + 1] - params.cu_seqlens_q[bidb], 0,
                                             params.seqlen_q)
                                     : params.seqlen_q),
        q_row_start(params.cu_seqlens_q ? params.cu_seqlens_q[bidb] : 0),
        is_varlen(params.cu_seqlens_q != nullptr) {
    int used = params.cu_seqlens_k ? params.cu_seqlens_k[bidb + 1] - params.cu_seqlens_k[bidb] : params.seqlen_k;
    if (params.seqused_k) used = params.seqused_k[bidb];
    const int leftpad = params.leftpad_k ? clamp(params.leftpad_k[bidb], 0, params.seqlen_k) : 0;
    seqlen_k = clamp(used - leftpad, 0, params.seqlen_k - leftpad);
    k_row_start = (params.cu_seqlens_k ? params.cu_seqlens_k[bidb] : 0) + leftpad;
    k_batch = params.cu_seqlens_k || params.block_table ? 0 : bidb;
    if (params.kv_batch_idx) {
      k_batch = params.kv_batch_idx[bidb];
      if (k_batch < 0 || k_batch >= params.kv_batch) {
        k_batch = 0;
        seqlen_k = 0;
      }
    }
  }

  // Element offset of row 0 of (batch bidb, head h) in a Q-side tensor, and of key row 0 of head h
  // in a K-side one (for a paged cache: of head h in page 0).
  FLASH_HOST_DEVICE index_t q_offset(TensorView const& t, int bidb, int h) const {
    return (is_varlen ? q_row_start * t.row_stride : bidb * t.batch_stride) + h * t.head_stride;
  }
  FLASH_HOST_DEVICE index_t k_offset(TensorView const& t, int h) const {
    return k_batch * t.batch_stride + k_row_start * t.row_stride + h * t.head_stride;
  }
  // Offset of row 0 of (batch bidb, head h) in softmax_lse.
  FLASH_HOST_DEVICE index_t lse_offset(FwdParams const& params, int bidb, int h) const {
    return (is_varlen ? q_row_start : bidb * params.lse_batch_stride) + h * params.lse_head_stride;
  }
  // Offset (in floats) of row 0 of (batch bidb, head h) in the backward's dQ accumulator.
  FLASH_HOST_DEVICE index_t dq_accum_offset(BwdParams const& params, int bidb, int h) const {
    return (is_varlen ? (q_row_start + index_t(bidb) * params.dq_accum_varlen_pad) * params.dq_accum_row_stride
                      : bidb * params.dq_accum_batch_stride) +
           h * params.dq_accum_head_stride;
  }

 private:
  FLASH_HOST_DEVICE static int clamp(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }
};

// Element offset (head excluded) of key row `row` of sequence bidb in a paged K or V, or -1 when the
// block table sends it to a page outside the cache. row < params.seqlen_k, the table's capacity.
FLASH_HOST_DEVICE index_t paged_row_offset(FwdParams const& params, TensorView const& t, int bidb, int row) {
  const int page = params.block_table[bidb * params.block_table_batch_stride + row / params.page_size];
  if (page < 0 || page >= params.kv_batch) return -1;
  return page * t.batch_stride + index_t(row % params.page_size) * t.row_stride;
}

// Key blocks visited by one query row block, walked from n_block_max - 1 down to n_block_min.
// The top n_masked_steps blocks hold at least one invisible (row, key) pair and run the masked
// step; every block below them is fully visible to every row and runs mask-free.
struct NBlockRange {
  int n_block_min;
  int n_block_max;  // exclusive; n_block_max <= n_block_min means the rows see no key
  int n_masked_steps;
};

// Query row i sees key j iff j < seqlen_k and, when causal, j <= i + seqlen_k - seqlen_q
// (bottom-right aligned, flash-attn >= 2.1).
FLASH_HOST_DEVICE constexpr NBlockRange fwd_n_block_range(int m_block, int block_m, int block_n,
                                                         int seqlen_q, int seqlen_k, bool is_causal) {
  const int diag_offset = seqlen_k - seqlen_q;
  // One past the last key seen by the block's last row, and by its first row.
  int key_end_last_row = seqlen_k;
  int key_end_first_row = seqlen_k;
  if (is_causal) {
    const int last_row_end = (m_block + 1) * block_m + diag_offset;
    const int first_row_end = m_block * block_m + diag_offset + 1;
    key_end_last_row = last_row_end < seqlen_k ? last_row_end : seqlen_k;
    key_end_first_row = first_row_end < seqlen_k ? first_row_end : seqlen_k;
  }
  const int n_block_max = key_end_last_row > 0 ? ceil_div(key_end_last_row, block_n) : 0;
  // Blocks that end at or before key_end_first_row are visible to every row of the block.
  int n_unmasked = key_end_first_row > 0 ? key_end_first_row / block_n : 0;
  if (n_unmasked > n_block_max) n_unmasked = n_block_max;
  return {0, n_block_max, n_block_max - n_unmasked};
}

// Query row blocks that see at least one key of key block n_block, walked upward from m_block_min
// (the backward's loop). The first n_masked_steps blocks hold an invisible (row, key) pair: the
// causal diagonal, or every block when the key block runs past seqlen_k. The rest run mask-free.
// The inverse of fwd_n_block_range: m_block is in the range of n_block iff n_block < its n_block_max.
struct MBlockRange {
  int m_block_min;
  int m_block_max;  // exclusive; m_block_max <= m_block_min means no row sees the key block
  int n_masked_steps;
};

FLASH_HOST_DEVICE constexpr MBlockRange bwd_m_block_range(int n_block, int block_m, int block_n,
                                                         int seqlen_q, int seqlen_k, bool is_causal) {
  const int m_block_max = ceil_div(seqlen_q, block_m);
  const int key_first = n_block * block_n;
  if (key_first >= seqlen_k) return {0, 0, 0};
  const int key_end = (n_block + 1) * block_n;
  const int key_last = (key_end < seqlen_k ? key_end : seqlen_k) - 1;
  int m_block_min = 0;
  int m_block_full = 0;  // the first block whose every row sees every key of the key block
  if (is_causal) {
    // Row i sees key j iff i >= j - (seqlen_k - seqlen_q).
    const int diag_offset = seqlen_k - seqlen_q;
    const int first_row = key_first - diag_offset;
    const int full_row = key_last - diag_offset;
    m_block_min = first_row > 0 ? first_row / block_m : 0;
    m_block_full = full_row > 0 ? ceil_div(full_row, block_m) : 0;
  }
  if (m_block_min >= m_block_max) return {m_block_min, m_block_min, 0};
  const int masked_end = key_end > seqlen_k ? m_block_max : (m_block_full < m_block_max ? m_block_full : m_block_max);
  return {m_block_min, m_block_max, masked_end > m_block_min ? masked_end - m_block_min : 0};
}

}  // namespace flash_attn_cute
