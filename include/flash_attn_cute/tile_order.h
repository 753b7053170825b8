// The order in which the persistent warp-specialized Hopper forward (fwd_kernel_sm90_ws.h) takes its
// tiles (query row block, batch, head). CTA c starts with tile c, then takes the next tile not yet
// taken from a counter, so the work balances itself, for causal and varlen tiles of every size.
// Host-and-device, no CuTe: the C++ unit tests exercise it on the CPU.
#pragma once

#include <cstdint>

#include "block_info.h"

namespace flash_attn_cute {

struct FwdWsTile {
  int m_block, bidb, bidh;
};

// The (batch, head) pairs go in sections; in a section, row block by row block, each over the
// section's pairs (a GQA group's heads side by side). Non-causal, a section is one pair: the CTAs in
// flight read the same K and V. Causal, its pairs' K and V fit in L2 together, and row blocks go
// from the bottom up: the heaviest first, and the lightest fill the end of the launch. Measured on
// H200 (session 20, bf16): one pair per section is 2-7 % faster non-causal (hdim 128 seqlen 1024:
// 470 TFLOP/s against 440) and 4-9 % slower causal (hdim 256 causal 1024: 328 against 357) than
// sections of 32 MB.
struct FwdWsTileOrder {
  static constexpr int64_t kL2Bytes = int64_t(32) << 20;  // of the H200's 50 MB
  int m_blocks, heads, pairs, section;

  // kv_bytes: one head's K and V.
  FLASH_HOST_DEVICE static FwdWsTileOrder make(int m_blocks, int batch, int heads, int64_t kv_bytes, bool causal) {
    const int pairs = batch * heads;
    const int64_t fit = !causal ? 1 : kv_bytes > 0 ? kL2Bytes / kv_bytes : pairs;
    return {m_blocks, heads, pairs, fit < 1 ? 1 : fit > pairs ? pairs : int(fit)};
  }
  FLASH_HOST_DEVICE int n_tiles() const { return m_blocks * pairs; }

  template <bool Is_causal>
  FLASH_HOST_DEVICE FwdWsTile tile(int t) const {
    const int first = t / (section * m_blocks) * section;  // the section's first pair
    const int width = section < pairs - first ? section : pairs - first;
    const int r = t - first * m_blocks;
    const int m = r / width, pair = first + r - m * width;
    return {Is_causal ? m_blocks - 1 - m : m, pair / heads, pair % heads};
  }
};

}  // namespace flash_attn_cute
