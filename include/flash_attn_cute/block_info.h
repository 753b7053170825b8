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

  // In varlen mode a sequence longer than max_seqlen_q / max_seqlen_k, or reaching outside the
  // tensors (caller errors that cannot be checked without reading the device's cu_seqlens), is cut
  // to them: the grids and scratch buffers are sized by the maxima and the totals, so the kernels
  // never index past them.
  FLASH_HOST_DEVICE BlockInfo(FwdParams const& params, int bidb) : is_varlen(params.cu_seqlens_q != nullptr) {
    // A paged cache has neither left padding nor batch indirection (the block table is both).
    const bool paged = params.block_table != nullptr;
    seqlen_q = params.seqlen_q;
    q_row_start = 0;
    if (params.cu_seqlens_q) {
      q_row_start = clamp_rows(params.cu_seqlens_q[bidb], params.total_q);
      const index_t rows_left = params.total_q - q_row_start;
      seqlen_q = int(clamp_rows(clamp_rows(params.cu_seqlens_q[bidb + 1], params.total_q) - q_row_start,
                                params.seqlen_q < rows_left ? params.seqlen_q : rows_left));
    }
    index_t k_start = 0;
    int used = params.seqlen_k;
    if (params.cu_seqlens_k) {
      k_start = paged ? 0 : clamp_rows(params.cu_seqlens_k[bidb], params.total_k);
      const index_t end = paged ? index_t(params.cu_seqlens_k[bidb + 1]) - params.cu_seqlens_k[bidb]
                                : clamp_rows(params.cu_seqlens_k[bidb + 1], params.total_k) - k_start;
      used = int(clamp_rows(end, params.seqlen_k));
    }
    // seqused_k never reaches past the sequence's own keys in varlen mode (the next sequence's rows,
    // or past the tensor for the last one).
    if (params.seqused_k) used = params.cu_seqlens_k ? clamp(params.seqused_k[bidb], 0, used) : params.seqused_k[bidb];
    const int leftpad = params.leftpad_k && !paged ? clamp(params.leftpad_k[bidb], 0, params.seqlen_k) : 0;
    seqlen_k = clamp(used - leftpad, 0, params.seqlen_k - leftpad);
    // Paged keys live in the pages: cu_seqlens_k then only gives each sequence's length.
    k_row_start = k_start + leftpad;
    k_batch = params.cu_seqlens_k || paged ? 0 : bidb;
    if (params.kv_batch_idx && !paged) {
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
  // Those rows' first element, typed.
  template <class Element>
  FLASH_HOST_DEVICE Element* q_head(TensorView const& t, int bidb, int h) const {
    return static_cast<Element*>(t.ptr) + q_offset(t, bidb, h);
  }
  template <class Element>
  FLASH_HOST_DEVICE Element* k_head(TensorView const& t, int h) const {
    return static_cast<Element*>(t.ptr) + k_offset(t, h);
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
  FLASH_HOST_DEVICE static index_t clamp_rows(index_t x, index_t hi) { return x < 0 ? 0 : (x > hi ? hi : x); }
};

// Element offset (head excluded) of key row `row` of sequence bidb in a paged K or V, or -1 when the
// block table sends it to a page outside the cache. row < params.seqlen_k, the table's capacity.
FLASH_HOST_DEVICE index_t paged_row_offset(FwdParams const& params, TensorView const& t, int bidb, int row) {
  const int page = params.block_table[bidb * params.block_table_batch_stride + row / params.page_size];
  if (page < 0 || page >= params.kv_batch) return -1;
  return page * t.batch_stride + index_t(row % params.page_size) * t.row_stride;
}

// Key blocks visited by one query row block, walked from n_block_max - 1 down to n_block_min. Every
// block in [n_block_min, n_block_max) holds a visible (row, key) pair. Blocks that also hold an
// invisible pair run the masked step: the top n_masked_steps blocks (the causal diagonal, the right
// window edge, the ragged end of the keys), and the blocks below n_block_unmasked_min (the left
// window edge). The blocks in between run mask-free.
struct NBlockRange {
  int n_block_min;
  int n_block_max;  // exclusive; n_block_max <= n_block_min means the rows see no key
  int n_masked_steps;
  int n_block_unmasked_min;

  FLASH_HOST_DEVICE constexpr bool is_masked(int n_block) const {
    return n_block >= n_block_max - n_masked_steps || n_block < n_block_unmasked_min;
  }
};

FLASH_HOST_DEVICE constexpr int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
FLASH_HOST_DEVICE constexpr int min_int(int a, int b) { return a < b ? a : b; }
FLASH_HOST_DEVICE constexpr int max_int(int a, int b) { return a > b ? a : b; }

FLASH_HOST_DEVICE constexpr NBlockRange fwd_n_block_range(int m_block, int block_m, int block_n, int seqlen_q,
                                                         int seqlen_k, Window window) {
  const int diag = seqlen_k - seqlen_q;
  const int first_row = m_block * block_m;
  const int last_row = min_int(first_row + block_m, seqlen_q) - 1;  // rows past seqlen_q are not output
  if (last_row < first_row) return {0, 0, 0, 0};
  // One past the last key seen by the block's last and first row; the first key of its first and
  // last row.
  const int key_end_last = window.right >= 0 ? min_int(seqlen_k, last_row + diag + window.right + 1) : seqlen_k;
  const int key_end_first = window.right >= 0 ? min_int(seqlen_k, first_row + diag + window.right + 1) : seqlen_k;
  const int key_begin_first = window.left >= 0 ? max_int(0, first_row + diag - window.left) : 0;
  const int key_begin_last = window.left >= 0 ? max_int(0, last_row + diag - window.left) : 0;
  const int n_block_min = key_begin_first / block_n;
  const int n_block_max = key_end_last > key_begin_first ? ceil_div(key_end_last, block_n) : n_block_min;
  // Blocks that end at or before key_end_first are visible to every row on the right; blocks that
  // start at or after key_begin_last, on the left.
  const int n_full_right = max_int(n_block_min, min_int(n_block_max, key_end_first > 0 ? key_end_first / block_n : 0));
  const int n_full_left = min_int(n_block_max, max_int(n_block_min, ceil_div(key_begin_last, block_n)));
  return {n_block_min, n_block_max, n_block_max - n_full_right, n_full_left};
}

// The order a forward walks a row block's key blocks: from n_block_start up to n_block_max - 1,
// then from n_block_start - 1 down to n_block_min. Started at the top (n_block_max - 1), the
// top-down walk. With ALiBi a row's bias peaks at its diagonal key and falls on both sides of it,
// so a walk started at the diagonal's block meets each row's largest biases first and no later
// block raises a row's max by more than the online softmax passes without rescaling O (softmax.h's
// lazy rescale); top-down, a non-causal row's max rose block after block down to its diagonal.
struct KeyBlockWalk {
  int n_block_min;
  int n_block_max;
  int n_block_start;
  int n_lead = 1;  // the first steps, which run masked where fwd_walk takes kLead (diagonal_steps)

  FLASH_HOST_DEVICE constexpr int steps() const { return n_block_max - n_block_min; }
  FLASH_HOST_DEVICE constexpr int n_block(int step) const {
    return step < n_block_max - n_block_start ? n_block_start + step : n_block_max - 1 - step;
  }
};

// range walked top-down, or (peak_first) from the block of row first_row's diagonal, kept in range.
FLASH_HOST_DEVICE constexpr KeyBlockWalk fwd_key_block_walk(NBlockRange const& range, bool peak_first = false,
                                                            int first_row = 0, int block_n = 1, int seqlen_q = 0,
                                                            int seqlen_k = 0) {
  const int top = range.n_block_max - 1;
  const int diag_block = max_int(range.n_block_min, min_int(top, floor_div(first_row + seqlen_k - seqlen_q, block_n)));
  return {range.n_block_min, range.n_block_max, peak_first ? diag_block : top};
}

// The steps of a walk from the peak (fwd_key_block_walk's, from the block of the first row's
// diagonal) whose blocks hold the diagonal key of some row up to one whose diagonal lies in block
// last_diagonal_block (floor_div(row + seqlen_k - seqlen_q, block_n)), at least the first step:
// they come first. The walk's later blocks lie wholly on one side of those rows' diagonals: right
// of them above last_diagonal_block, left of them below.
FLASH_HOST_DEVICE constexpr int diagonal_steps(KeyBlockWalk const& walk, int last_diagonal_block) {
  return max_int(1, min_int(last_diagonal_block, walk.n_block_max - 1) - walk.n_block_start + 1);
}

// Query row blocks that see at least one key of key block n_block (the backward's loop walks them
// in bwd_walk_row_block's order). Blocks below m_block_min + n_masked_steps (the causal diagonal and right
// window edge, or every block when the key block runs past seqlen_k) and blocks from
// m_block_unmasked_max on (the left window edge) hold an invisible (row, key) pair and run masked.
// The inverse of fwd_n_block_range: m_block is in the range of n_block iff n_block is in its range.
struct MBlockRange {
  int m_block_min;
  int m_block_max;  // exclusive; m_block_max <= m_block_min means no row sees the key block
  int n_masked_steps;
  int m_block_unmasked_max;

  FLASH_HOST_DEVICE constexpr bool is_masked(int m_block) const {
    return m_block < m_block_min + n_masked_steps || m_block >= m_block_unmasked_max;
  }
};

FLASH_HOST_DEVICE constexpr MBlockRange bwd_m_block_range(int n_block, int block_m, int block_n, int seqlen_q,
                                                         int seqlen_k, Window window) {
  const int key_first = n_block * block_n;
  if (key_first >= seqlen_k || seqlen_q <= 0) return {0, 0, 0, 0};
  const int key_end = (n_block + 1) * block_n;
  const int key_last = min_int(key_end, seqlen_k) - 1;
  const int diag = seqlen_k - seqlen_q;
  // Row i sees key j iff j - diag - right <= i <= j - diag + left: the rows that see some key of
  // the block, and the blocks whose every row sees every key.
  const int row_lo = window.right >= 0 ? max_int(0, key_first - diag - window.right) : 0;
  const int row_hi = window.left >= 0 ? min_int(seqlen_q - 1, key_last - diag + window.left) : seqlen_q - 1;
  if (row_lo > row_hi) return {0, 0, 0, 0};
  const int m_block_min = row_lo / block_m;
  const int m_block_max = row_hi / block_m + 1;
  // Every row of block m sees every key of the block on the right iff its first row does, on the
  // left iff its last row (< seqlen_q) does.
  const int row_full_hi = key_first - diag + window.left;  // the last row that sees key_first
  int full_lo = window.right >= 0 ? ceil_div(max_int(0, key_last - diag - window.right), block_m) : 0;
  int full_hi = window.left < 0 || row_full_hi >= seqlen_q - 1 ? m_block_max : floor_div(row_full_hi + 1, block_m);
  if (key_end > seqlen_k) full_lo = m_block_max;  // the ragged last key block: every row block masked
  full_lo = min_int(m_block_max, max_int(m_block_min, full_lo));
  full_hi = min_int(m_block_max, max_int(full_lo, full_hi));
  return {m_block_min, m_block_max, full_lo - m_block_min, full_hi};
}

// The deterministic backward's dQ order. Each query row block takes the dQ tiles of the key blocks
// that visit it one at a time: its counter (BwdParams::dq_semaphore) holds the key block whose turn
// it is, seeded with dq_first_key_block by the preprocess kernel, and each key block, once its tile
// is added, hands the turn to dq_next_key_block, the same for all its row blocks.
// Rotated (BwdParams::dq_rotate; not causal, no window, no more key blocks than row blocks): key
// block n of n_count starts at the n-th row block from the last and walks down, wrapping around,
// one row block per step (bwd_kernel.h), so it reaches the row block `from_last` blocks from the
// last at step (from_last - n) mod (row blocks). The order is that of those steps: key block
// min(from_last, n_count - 1) first, then downwards, wrapping around to n_count - 1. Otherwise the
// key blocks that visit a row block (a contiguous range) go from the first up; every key block
// walks down from its last row block, which does not fall as the key block rises.
// Rotated, when the key blocks of a head run in step, no key block waits for another in the steady
// state, but a key block may wait for one launched after it: all key blocks of a head must be
// resident at once. Otherwise a key block only waits for key blocks launched before it, and those
// that reach a row block in the same step (all of them, without a mask) wait in a chain.
FLASH_HOST_DEVICE constexpr bool dq_rotated(bool dq_rotate, Window window, int n_count, int m_count) {
  return dq_rotate && window.left < 0 && window.right < 0 && n_count <= m_count;
}

FLASH_HOST_DEVICE constexpr int dq_first_key_block(int m_block, int block_m, int block_n, int seqlen_q, int seqlen_k,
                                                   Window window, bool dq_rotate) {
  const int m_count = ceil_div(seqlen_q, block_m);
  const int n_count = ceil_div(seqlen_k, block_n);
  if (dq_rotated(dq_rotate, window, n_count, m_count)) return min_int(m_count - 1 - m_block, n_count - 1);
  return fwd_n_block_range(m_block, block_m, block_n, seqlen_q, seqlen_k, window).n_block_min;
}

FLASH_HOST_DEVICE constexpr int dq_next_key_block(int n_block, int n_count, bool rotated) {
  if (!rotated) return n_block + 1;
  return n_block == 0 ? n_count - 1 : n_block - 1;
}

// The counter of query row block m_block (of block_m rows) of sequence bidb, head bidh.
FLASH_HOST_DEVICE int* dq_semaphore_at(BwdParams const& params, int bidb, int bidh, int m_block, int block_m) {
  return params.dq_semaphore + (index_t(bidb) * params.heads + bidh) * ceil_div(params.seqlen_q, block_m) + m_block;
}

// The row block a backward CTA (key block n_block, row blocks [m_block_min, m_block_max)) visits
// at step i of its walk: upwards by default; deterministic, downwards from the last, and rotated by
// n_block (wrapping around) when the order is rotated.
FLASH_HOST_DEVICE constexpr int bwd_walk_row_block(int i, MBlockRange const& range, int n_block, bool deterministic,
                                                   bool rotated) {
  if (!deterministic) return range.m_block_min + i;
  const int m_block = range.m_block_max - 1 - i - (rotated ? n_block : 0);
  return m_block < range.m_block_min ? m_block + (range.m_block_max - range.m_block_min) : m_block;
}

}  // namespace flash_attn_cute
