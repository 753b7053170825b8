// Split-KV (issue 4), the host-and-device pieces: how many splits a launch gets, which key blocks
// one split walks, and the math that merges the splits' partial (O, LSE). No CuTe: the C++ unit
// tests run all of it on the CPU; the split-KV forward and the combine kernel call the same code.
#pragma once

#include <cmath>

#include "block_info.h"

namespace flash_attn_cute {

inline constexpr int kMaxSplits = 128;

// The number of splits for a launch of `ctas` CTAs (batch * heads * query row blocks), each over
// `n_blocks` key blocks, on a device that runs `slots` of these CTAs at once (SMs times CTAs per
// SM). A launch that already fills most slots is not split. Otherwise every split count s whose
// last wave is fullest is a candidate (efficiency = waves / ceil(waves) with waves = ctas * s /
// slots); the smallest s within kSplitEfficiencyShare of the best efficiency wins, as splits cost a
// combine pass and partial outputs. Counts that give the same blocks per split as s - 1 only add
// empty splits and are skipped.
//
// The share is 95 %, not flash-attn 2.x's 85 %: a decode step reads the cache at the rate of the
// CTAs in flight, and the combine pass costs little beside it. Measured on H200 (hdim 128, 8 KV
// heads, every num_splits timed): batch 8 over 8k keys 67.0 us at 16 splits (97 % of the slots)
// against 68.4 at 85 %'s 14; batch 1 over 32k keys 38.5 us at 128 against 38.8 at 114.
inline constexpr float kSplitEfficiencyShare = 0.95f;
FLASH_HOST_DEVICE constexpr int num_splits_heuristic(int ctas, int slots, int n_blocks, int max_splits) {
  if (ctas <= 0 || slots <= 0 || n_blocks <= 1 || 10 * ctas >= 8 * slots) return 1;
  int limit = max_splits < slots ? max_splits : slots;
  if (limit > n_blocks) limit = n_blocks;
  if (limit > kMaxSplits) limit = kMaxSplits;
  auto efficiency = [&](int s) {
    const float waves = float(ctas) * s / slots;
    return waves / float(ceil_div(ctas * s, slots));
  };
  auto useful = [&](int s) { return s == 1 || ceil_div(n_blocks, s) != ceil_div(n_blocks, s - 1); };
  float best = 0.f;
  for (int s = 1; s <= limit; ++s) {
    if (useful(s) && efficiency(s) > best) best = efficiency(s);
  }
  for (int s = 1; s <= limit; ++s) {
    if (useful(s) && efficiency(s) >= kSplitEfficiencyShare * best) return s;
  }
  return 1;
}

// Warps per split-KV CTA. A launch of two or four splits runs them as the warps of one CTA, which
// merge their results in shared memory (merge_warp_splits, combine.h), instead of as one-warp CTAs
// merged by the combine kernel: that kernel's launch and round trip to memory cost as much as a
// tenth of a decode step over a short cache. Other counts keep one-warp CTAs.
inline constexpr int kMaxSplitWarps = 4;
FLASH_HOST_DEVICE constexpr int split_warps(int num_splits) {
  return num_splits == 2 || num_splits == kMaxSplitWarps ? num_splits : 1;
}

// Whether the split-KV kernel is launched dependent on the kernel before it (programmatic dependent
// launch, launch.h), so that a decode loop's next call starts while the previous call's combine
// finishes. That saves about 0.3 us a call, but on H200 it made long one-wave launches 1.5-2.5 %
// slower (batch 1 / 8 over 128k keys, hdim 128, 8 KV heads: 127.8 -> 130.9 us, 949 -> 968 us),
// i.e. more than it saves past about 15 us. So only launches that read at most
// kDependentSplitMaxBytes of keys and values (a 15 us read at about 4 TB/s) take it: batch 1 over
// 1k keys went from 6.7 to 6.4 us.
inline constexpr double kDependentSplitMaxBytes = 64.0 * 1024 * 1024;
FLASH_HOST_DEVICE constexpr bool split_launch_dependent(int batch, int heads_k, int seqlen_k, int head_dim,
                                                        int element_bytes) {
  return 2.0 * batch * heads_k * seqlen_k * head_dim * element_bytes <= kDependentSplitMaxBytes;
}

// The CTAs that share one query row block's splits: its num_splits / split_warps(num_splits) CTA
// splits. Only a launch with more than one has partials for the combine kernel to merge.
FLASH_HOST_DEVICE constexpr int split_ctas(int num_splits) { return num_splits / split_warps(num_splits); }

// The key blocks of split `split` out of `num_splits` over a query block's range [n_block_min,
// n_block_max): consecutive equal shares (the last ones may be short or empty). Each block keeps
// its masked / mask-free kind: the top masked blocks of the whole range are the top blocks of the
// splits that hold them, and the left window's masked blocks stay below n_block_unmasked_min.
FLASH_HOST_DEVICE constexpr NBlockRange split_n_block_range(NBlockRange full, int num_splits, int split) {
  const int total = full.n_block_max > full.n_block_min ? full.n_block_max - full.n_block_min : 0;
  const int per_split = ceil_div(total, num_splits > 0 ? num_splits : 1);
  int lo = full.n_block_min + split * per_split;
  int hi = lo + per_split;
  if (hi > full.n_block_max) hi = full.n_block_max;
  if (lo > hi) lo = hi;
  const int first_masked = full.n_block_max - full.n_masked_steps;  // blocks at or above it are masked
  const int masked = hi > first_masked ? hi - (lo > first_masked ? lo : first_masked) : 0;
  const int unmasked_min = full.n_block_unmasked_min < lo ? lo : (full.n_block_unmasked_min > hi ? hi : full.n_block_unmasked_min);
  return {lo, hi, masked, unmasked_min};
}

// The combine kernel's warps per query row: a warp reads `chunk` splits per round trip to memory, so
// rows of more splits take more warps of the CTA (a power of two, at most `warps`), which take
// alternate chunks and merge their folds in shared memory.
FLASH_HOST_DEVICE constexpr int combine_warps_per_row(int num_splits, int chunk, int warps) {
  int w = 1;
  while (w < warps && w * chunk < num_splits) w *= 2;
  return w;
}

// Merges the partial results of one query row over its splits. Each split reports the natural-log
// LSE of its scaled scores (-inf when it saw no key) and its O normalised by its own sum:
//   LSE = max + log(sum_i exp(lse_i - max)),  O = sum_i exp(lse_i - LSE) * O_i.
// The splits come in chunks (the combine kernel reads a chunk's LSEs and O's at once). The fold keeps
// the running max and sum; the caller keeps acc = sum_i weight(lse_i) * O_i, multiplies it by what
// add_chunk returns (the max may have risen), and scales it by out_scale() at the end. A row that saw
// no key in any split gets LSE = +inf and O = 0, the forward's convention.
struct SplitCombine {
  float max_lse = -INFINITY;
  float sum = 0.f;  // sum_i exp(lse_i - max_lse)

  // Folds in a chunk of LSEs (-inf past the last split); returns the factor for the acc so far.
  template <int N>
  FLASH_HOST_DEVICE float add_chunk(float const (&lse)[N]) {
    float new_max = max_lse;
    for (int i = 0; i < N; ++i) new_max = lse[i] > new_max ? lse[i] : new_max;
    if (new_max == -INFINITY) return 1.f;  // no split has seen a key yet
    const float scale = expf(max_lse - new_max);  // 0 while max_lse is -inf (sum and acc are 0)
    max_lse = new_max;
    sum *= scale;
    for (int i = 0; i < N; ++i) sum += weight(lse[i]);
    return scale;
  }

  // Folds in another fold of other splits (the combine kernel's warps that share a row). Returns the
  // factors for this fold's acc and for the other's; their weighted sum is the merged acc.
  struct Scales {
    float self, other;
  };
  FLASH_HOST_DEVICE Scales merge(SplitCombine const& other) {
    const float new_max = other.max_lse > max_lse ? other.max_lse : max_lse;
    if (new_max == -INFINITY) return {1.f, 0.f};  // neither has seen a key
    const Scales scales{expf(max_lse - new_max), expf(other.max_lse - new_max)};
    max_lse = new_max;
    sum = sum * scales.self + other.sum * scales.other;
    return scales;
  }

  // The unnormalised weight exp(lse_i - max) of a split of the chunk just added (0 when empty).
  FLASH_HOST_DEVICE float weight(float lse_i) const { return lse_i == -INFINITY ? 0.f : expf(lse_i - max_lse); }

  FLASH_HOST_DEVICE float lse() const { return sum > 0.f ? max_lse + logf(sum) : INFINITY; }

  FLASH_HOST_DEVICE float out_scale() const { return sum > 0.f ? 1.f / sum : 0.f; }
};

}  // namespace flash_attn_cute
