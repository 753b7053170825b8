// Host-side unit tests of the torch-free headers: the tile tables, the key-block range each query
// block visits (and the backward's inverse), the visibility rule, BlockInfo's offsets, the
// split-KV heuristic, ranges and combine math, the persistent Hopper forward's tile order, and
// dropout's RNG and the MMA fragments it relies on. Compiled by nvcc as host code only (mask.h
// pulls in CuTe, which only nvcc parses), no GPU needed.
//
//   test_host_units                    run every case
//   test_host_units CASE [CASE...]     run the named cases (see kCases below)
//   test_host_units --list             print the case names, one a line
//   test_host_units --print-head-dims  print kFwdHeadDims, space-separated
//
// Prints one line per case and `N passed, M failed` (checks) last; exits non-zero on any failure.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <iterator>
#include <utility>
#include <vector>

#include "flash_attn_cute/block_info.h"
#include "flash_attn_cute/bwd_kernel_traits.h"
#include "flash_attn_cute/bwd_api.h"
#include "flash_attn_cute/bwd_kernel_sm90.h"
#include "flash_attn_cute/dropout.h"
#include "flash_attn_cute/fwd_mainloop.h"
#include "flash_attn_cute/kernel_traits.h"
#include "flash_attn_cute/rotary_copy.h"
#include "flash_attn_cute/mask.h"
#include "flash_attn_cute/params.h"
#include "flash_attn_cute/split_kv.h"
#include "flash_attn_cute/tile_order.h"
#include "flash_attn_cute/tile_size.h"
#include "flash_attn_cute/varlen_rows.h"

namespace {

using namespace flash_attn_cute;

// ----------------------------------------------------------------------------------------------
// The harness: CHECK records a failure (file:line, expression, message) and carries on, so one run
// reports every broken case; only the first kMaxReported failures of each case are printed in full.

long g_passed = 0;
long g_failed = 0;
long g_failed_in_case = 0;
constexpr long kMaxReported = 30;

void record(bool ok, const char* file, int line, const char* expr, const std::string& msg) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  ++g_failed_in_case;
  if (g_failed_in_case <= kMaxReported) {
    std::printf("FAIL %s:%d: %s%s%s\n", file, line, expr, msg.empty() ? "" : ": ", msg.c_str());
  } else if (g_failed_in_case == kMaxReported + 1) {
    std::printf("(further failures not printed)\n");
  }
}

#define CHECK(cond, msg) record(static_cast<bool>(cond), __FILE__, __LINE__, #cond, (msg))
#define CHECK_EQ(a, b, msg)                                                                   \
  do {                                                                                        \
    const long long _a = static_cast<long long>(a), _b = static_cast<long long>(b);           \
    record(_a == _b, __FILE__, __LINE__, #a " == " #b,                                        \
           std::string(msg) + " (got " + std::to_string(_a) + ", expected " + std::to_string(_b) + ")"); \
  } while (0)

template <class... Args>
std::string fmt(const char* f, Args... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), f, args...);
  return buf;
}

// ----------------------------------------------------------------------------------------------
// tile_table

void test_tile_table() {
  const int n_dims = static_cast<int>(sizeof(kFwdHeadDims) / sizeof(kFwdHeadDims[0]));
  CHECK(n_dims > 0, "kFwdHeadDims is empty");
  for (int i = 0; i < n_dims; ++i) {
    CHECK(kFwdHeadDims[i] % 8 == 0, fmt("kFwdHeadDims[%d] = %d is not a multiple of 8", i, kFwdHeadDims[i]));
    if (i > 0) {
      CHECK(kFwdHeadDims[i] > kFwdHeadDims[i - 1], fmt("kFwdHeadDims not strictly ascending at %d", i));
    }
  }
  CHECK_EQ(kFwdHeadDims[n_dims - 1], kMaxHeadDim, "the largest kernel head dim is kMaxHeadDim");
  // Small tiles (fwd_small_smem) where the SM80 forward's exceed sm_86 / sm_89's 99 KB a block:
  // csrc/features.py's FWD_SMALL, (256, non-causal), for every variant; none on sm_80 or Hopper.
  for (int i = 0; i < n_dims; ++i) {
    const int d = kFwdHeadDims[i];
    for (bool causal : {false, true}) {
      for (Variant v : {Variant::kPlain, Variant::kScoreMods, Variant::kDropout}) {
        const std::string where = fmt("fwd hdim %d%s variant %d", d, causal ? " causal" : "", int(v));
        CHECK_EQ(fwd_small_smem(d, causal, v, 99 * 1024), d == 256 && !causal, where + ": small tiles on sm_86");
        CHECK(!fwd_small_smem(d, causal, v, 163 * 1024) && !fwd_small_smem(d, causal, v, 227 * 1024),
              where + ": small tiles on sm_80 or Hopper");
        CHECK(fwd_smem_bytes(fwd_tile_shape(d, causal, v, true), d) <= 99 * 1024, where + ": small tiles over 99 KB");
      }
    }
  }
  // The split-KV tile: one 16-row warp; at least four CTAs share a 228 KB SM at every head dim.
  for (int i = 0; i < n_dims; ++i) {
    const FwdTileShape split = fwd_split_tile_shape(kFwdHeadDims[i]);
    CHECK(split.block_m == 16 * split.n_warps, fmt("split tile of hdim %d: one 16-row slab per warp", kFwdHeadDims[i]));
    CHECK(split.block_n > 0 && split.block_n % 16 == 0, fmt("split tile of hdim %d: block_n a multiple of 16 (P V's k-steps, pages)", kFwdHeadDims[i]));
    CHECK(4 * (fwd_smem_bytes(split, kFwdHeadDims[i]) + 1024) <= 228 * 1024,
          fmt("split tile of hdim %d: four CTAs per SM", kFwdHeadDims[i]));
    CHECK(kMaxSplitWarps * fwd_smem_bytes(split, kFwdHeadDims[i]) <= 99 * 1024,
          fmt("split tile of hdim %d: a CTA of kMaxSplitWarps warps fits in sm_86 / sm_89's 99 KB", kFwdHeadDims[i]));
    // merge_warp_splits: a warp's partial (fp32 O, then LSEs) fits where its Q, K and V were.
    CHECK(split.block_m * kFwdHeadDims[i] * 4 + 4 * split.block_m <= fwd_smem_bytes(split, kFwdHeadDims[i]),
          fmt("split tile of hdim %d: the warp's partial fits in its shared memory", kFwdHeadDims[i]));
  }
  // The Hopper forward: one warpgroup of 64 rows (a warpgroup MMA's M), key steps a multiple of 16
  // (the MMAs' k-steps), and fwd_sm90_ctas_per_sm CTAs (at least two) fit in a 228 KB SM, each with
  // 1 KB the system reserves.
  for (int i = 0; i < n_dims; ++i) {
    const FwdTileShape sm90 = fwd_sm90_tile_shape(kFwdHeadDims[i]);
    CHECK(sm90.block_m == 64 && sm90.n_warps == 4, fmt("sm90 tile of hdim %d: one 64-row warpgroup", kFwdHeadDims[i]));
    CHECK(sm90.block_n > 0 && sm90.block_n % 16 == 0, fmt("sm90 tile of hdim %d: block_n a multiple of 16", kFwdHeadDims[i]));
    const int ctas = fwd_sm90_ctas_per_sm(kFwdHeadDims[i], Variant::kPlain);
    CHECK(ctas >= 2 && fwd_sm90_ctas_per_sm(kFwdHeadDims[i], Variant::kScoreMods) >= 2 &&
              fwd_sm90_ctas_per_sm(kFwdHeadDims[i], Variant::kDropout) >= 2,
          fmt("sm90 tile of hdim %d: two CTAs per SM or more", kFwdHeadDims[i]));
    CHECK(fwd_sm90_ctas_per_sm(kFwdHeadDims[i], Variant::kScoreMods) <= ctas &&
              fwd_sm90_ctas_per_sm(kFwdHeadDims[i], Variant::kDropout) <= ctas,
          fmt("sm90 tile of hdim %d: the score-mod and dropout kernels no more CTAs per SM than plain", kFwdHeadDims[i]));
    CHECK(ctas * (fwd_smem_bytes(sm90, kFwdHeadDims[i]) + 2048) <= 228 * 1024,
          fmt("sm90 tile of hdim %d: %d CTAs per SM", kFwdHeadDims[i], ctas));
  }
  // The warp-specialized Hopper forward: a producer warpgroup plus one consumer warpgroup per 64
  // rows (two or three of them: the kernel's named barriers), key steps a multiple of 16, one CTA
  // per SM in shared memory; the kernel above for the rest. With and without three consumers.
  for (int i = 0; i < n_dims; ++i) {
    if (!fwd_sm90_warp_specialized(kFwdHeadDims[i])) continue;
    for (bool three : {false, true}) {
      const FwdTileShape ws = fwd_sm90_ws_tile_shape(kFwdHeadDims[i], three);
      const char* what = three ? "three consumers' sm90 ws tile" : "sm90 ws tile";
      CHECK(ws.block_m % 64 == 0 && ws.block_m / 64 >= 2 && ws.block_m / 64 <= 3 && ws.n_warps == 4 * (1 + ws.block_m / 64),
            fmt("%s of hdim %d: a producer and two or three consumer warpgroups of 64 rows", what, kFwdHeadDims[i]));
      CHECK(ws.block_n > 0 && ws.block_n % 16 == 0, fmt("%s of hdim %d: block_n a multiple of 16", what, kFwdHeadDims[i]));
      CHECK(fwd_sm90_ws_smem_bytes(ws, kFwdHeadDims[i]) + 1024 <= 228 * 1024,
            fmt("%s of hdim %d: one CTA per SM", what, kFwdHeadDims[i]));
    }
  }
  CHECK(fwd_sm90_ws_tile_shape(128, true).block_m == 192 && fwd_sm90_ws_tile_shape(96, true).block_m == 192 &&
            fwd_sm90_ws_tile_shape(64, true).block_m == 192 && fwd_sm90_ws_tile_shape(128).block_m == 128 &&
            fwd_sm90_ws_tile_shape(192, true).block_m == 128,
        "softcap's fixed offset: three consumer warpgroups at head dims 64 to 128, two above");
  CHECK(fwd_sm90_ws_has_three_consumers(64) && !fwd_sm90_ws_has_three_consumers(96) && !fwd_sm90_ws_has_three_consumers(128),
        "the kernels come with three consumers at head dim 64");
  // (kernel head dim, seqlen_q, seqlen_k, left, right)
  CHECK(fwd_sm90_ws_three_consumers_pay(64, 16384, 16384, -1, -1) &&
            fwd_sm90_ws_three_consumers_pay(64, 512, 512, -1, -1) &&
            fwd_sm90_ws_three_consumers_pay(64, 16384, 16384, -1, 0) &&
            fwd_sm90_ws_three_consumers_pay(64, 2048, 2048, -1, 0) &&
            fwd_sm90_ws_three_consumers_pay(64, 16384, 16384, 1024, 0) &&
            fwd_sm90_ws_three_consumers_pay(64, 16384, 16384, 512, 512) &&
            fwd_sm90_ws_three_consumers_pay(64, 1024, 1024, -1, 0) &&
            fwd_sm90_ws_three_consumers_pay(64, 1024, 4096, 600, 600),
        "three consumers from 512 keys a row");
  CHECK(!fwd_sm90_ws_three_consumers_pay(64, 256, 256, -1, -1) &&
            !fwd_sm90_ws_three_consumers_pay(64, 512, 512, -1, 0) &&
            !fwd_sm90_ws_three_consumers_pay(64, 16384, 16384, 256, 0) &&
            !fwd_sm90_ws_three_consumers_pay(128, 16384, 16384, -1, -1),
        "two consumers for fewer keys or rows, and at other head dims");
  CHECK(fwd_sm90_warp_specialized(64) && fwd_sm90_warp_specialized(256) && !fwd_sm90_warp_specialized(32),
        "the warp-specialized kernel's head dims");
  CHECK(fwd_sm90_ws_only(256, Variant::kScoreMods) && fwd_sm90_ws_only(256, Variant::kDropout) &&
            !fwd_sm90_ws_only(256, Variant::kPlain) && !fwd_sm90_ws_only(192, Variant::kScoreMods),
        "score mods and dropout at head dim 256: warp-specialized only");
  // The keys a row sees on average, against counts by brute force over the rows (params.h's rule).
  auto mean_keys = [](int sq, int sk, int left, int right) {
    double total = 0;
    for (int i = 0; i < sq; ++i) {
      for (int j = 0; j < sk; ++j) {
        const int diag = i + sk - sq;
        total += (right < 0 || j <= diag + right) && (left < 0 || j >= diag - left);
      }
    }
    return total / sq;
  };
  const int cases[][4] = {{1024, 1024, -1, -1}, {1024, 1024, -1, 0}, {300, 1000, -1, 0}, {1000, 300, -1, 0},
                          {2048, 2048, 256, 0}, {2048, 2048, 100, 30}, {512, 2048, 64, -1}};
  for (const auto& c : cases) {
    const double want = mean_keys(c[0], c[1], c[2], c[3]), got = fwd_mean_keys_per_row(c[0], c[1], c[2], c[3]);
    CHECK(got >= 0.9 * want - 1 && got <= 1.1 * want + 1,
          fmt("mean keys per row of %d x %d, window (%d, %d): %.1f, counted %.1f", c[0], c[1], c[2], c[3], got, want));
  }
  // (kernel head dim, seqlen_q, seqlen_k, left, right, softcap, score_mods[, tma])
  CHECK(fwd_sm90_ws_pays(128, 128, 128, -1, -1, true, true) && fwd_sm90_ws_pays(96, 128, 128, -1, -1, false, false) &&
            fwd_sm90_ws_pays(192, 128, 128, -1, -1, true, true) && fwd_sm90_ws_pays(256, 200, 100, -1, -1, false, true) &&
            fwd_sm90_ws_pays(64, 128, 128, -1, -1, false, false) &&
            fwd_sm90_ws_pays(64, 128, 128, -1, -1, false, true, false) &&
            !fwd_sm90_ws_pays(64, 256, 256, -1, -1, true, true) &&
            !fwd_sm90_ws_pays(32, 16384, 16384, -1, -1, false, false),
        "full rows take the warp-specialized kernel from head dim 64 on at any length, but softcap's at 64");
  CHECK(fwd_sm90_ws_pays(128, 128, 128, -1, 0, false, false) && fwd_sm90_ws_pays(96, 256, 256, 32, 32, false, true) &&
            fwd_sm90_ws_pays(128, 200, 200, -1, 0, false, true) && !fwd_sm90_ws_pays(128, 256, 256, -1, 0, true, true) &&
            !fwd_sm90_ws_pays(128, 512, 300, 64, 0, false, false) && !fwd_sm90_ws_pays(64, 256, 256, -1, 0, false, false),
        "short sequences (256 keys) with a window edge take it at head dims 96 and 128, but softcap's");
  CHECK(fwd_sm90_ws_pays(256, 256, 256, -1, 0, false, false) && fwd_sm90_ws_pays(192, 128, 128, 64, 0, false, false) &&
            !fwd_sm90_ws_pays(256, 256, 256, -1, 0, false, true) && !fwd_sm90_ws_pays(192, 200, 200, 32, 32, false, true) &&
            !fwd_sm90_ws_pays(256, 512, 300, -1, 0, false, false),
        "above head dim 128, short sequences with a window edge take it on the plain kernels only");
  CHECK(fwd_sm90_ws_pays(128, 512, 512, -1, 0, true, true) && fwd_sm90_ws_pays(256, 16384, 16384, 1024, 0, false, false) &&
            !fwd_sm90_ws_pays(128, 16384, 16384, 64, 64, false, true) &&
            !fwd_sm90_ws_pays(192, 16384, 16384, 128, 0, false, false),
        "from head dim 96 on, rows with a window edge take it where they see 256 keys or more");
  CHECK(fwd_sm90_ws_pays(64, 1024, 1024, -1, 0, false, false) && fwd_sm90_ws_pays(64, 512, 512, -1, -1, true, true) &&
            !fwd_sm90_ws_pays(64, 512, 512, -1, 0, false, false) &&
            !fwd_sm90_ws_pays(64, 1024, 1024, -1, 0, false, false, false),
        "at head dim 64 the rest from 512 keys a row, 1024 with cp.async loads");
  CHECK_EQ(fwd_sm90_ws_smem_bytes(fwd_sm90_ws_tile_shape(128), 128), 229504,
           "sm90 ws smem at hdim 128 (two Q buffers and O's)");
  CHECK_EQ(fwd_sm90_ws_smem_bytes(fwd_sm90_ws_tile_shape(256), 256), 196736, "sm90 ws smem at hdim 256 (O in Q's)");
  CHECK(fwd_sm90_ws_separate_o(fwd_sm90_ws_tile_shape(64), 64) && fwd_sm90_ws_separate_o(fwd_sm90_ws_tile_shape(128), 128) &&
            !fwd_sm90_ws_separate_o(fwd_sm90_ws_tile_shape(192), 192) &&
            !fwd_sm90_ws_separate_o(fwd_sm90_ws_tile_shape(256), 256),
        "the output tile has shared memory of its own up to head dim 128");
  for (int hdim : {64, 96, 128}) {
    for (bool three : {false, true}) {
      CHECK_EQ(fwd_sm90_ws_q_stages(fwd_sm90_ws_tile_shape(hdim, three), hdim), 2,
               fmt("two Q buffers at head dim %d%s", hdim, three ? " (three consumers' tile)" : ""));
    }
  }
  CHECK(fwd_sm90_ws_q_stages(fwd_sm90_ws_tile_shape(192), 192) == 1 &&
            fwd_sm90_ws_q_stages(fwd_sm90_ws_tile_shape(256), 256) == 1,
        "one Q buffer where O takes Q's");
  CHECK_EQ(fwd_smem_bytes(fwd_split_tile_shape(128), 128), 20480, "split tile smem at hdim 128");

  // Every supported head dim maps to the smallest kernel head dim >= it (found independently).
  for (int h = 8; h <= 256; h += 8) {
    int expected = 0;
    for (int i = 0; i < n_dims; ++i) {
      if (kFwdHeadDims[i] >= h && (expected == 0 || kFwdHeadDims[i] < expected)) expected = kFwdHeadDims[i];
    }
    CHECK(expected != 0, fmt("no kernel head dim covers %d", h));
    CHECK_EQ(fwd_kernel_head_dim(h), expected, fmt("fwd_kernel_head_dim(%d)", h));
  }
  CHECK_EQ(fwd_kernel_head_dim(264), 0, "fwd_kernel_head_dim(264) has no kernel");
  CHECK_EQ(fwd_kernel_head_dim(kMaxHeadDim + 8), 0, "fwd_kernel_head_dim(kMaxHeadDim + 8)");
  static_assert(fwd_kernel_head_dim(64) == 64, "fwd_kernel_head_dim is usable in constant expressions");

  // Tile shapes: M splits into 16-row MMA slabs per warp, N into 16-wide k-steps of P V, and the
  // Q tile plus the double-buffered K and V tiles (2 bytes an element) fit in 227 KB of smem.
  // The score-mod and dropout tiles too; dropout's block_n is a multiple of 32 (its chunks).
  for (int i = 0; i < 6 * n_dims; ++i) {
    const int d = kFwdHeadDims[i / 6];
    const bool causal = i % 2;
    const Variant variant = Variant((i / 2) % 3);
    const FwdTileShape t = fwd_tile_shape(d, causal, variant);
    const std::string where = fmt("hdim %d causal %d variant %d: tile (%d, %d, %d warps)", d, causal,
                                  int(variant), t.block_m, t.block_n, t.n_warps);
    CHECK(variant != Variant::kDropout || t.block_n % 32 == 0, where + ": block_n % 32 != 0");
    CHECK(t.block_m > 0 && t.block_n > 0 && t.n_warps > 0, where + ": non-positive field");
    if (t.n_warps <= 0) continue;
    CHECK(t.block_m % (16 * t.n_warps) == 0, where + ": block_m % (16 * n_warps) != 0");
    CHECK(t.block_n % 16 == 0, where + ": block_n % 16 != 0");
    const long smem = (static_cast<long>(t.block_m) * d + 2L * t.block_n * d) * 2;
    CHECK(smem <= 227L * 1024, where + fmt(": Q + 2 KV tiles need %ld bytes > 227 KB", smem));
  }
}

// ----------------------------------------------------------------------------------------------
// The visibility rule, written independently of the headers: key j is visible to query row i iff
// it exists (0 <= j < seqlen_k) and lies within the window around the bottom-right-aligned diagonal
// (causal: at or left of it).

// The windows the range and mask tests sweep: full, causal, local on either or both sides.
const Window kWindows[] = {{-1, -1}, {-1, 0}, {0, 0}, {5, -1}, {-1, 7}, {17, 3}, {64, 0}, {3, 40}, {0, -1}, {200, 100}};

std::string window_str(Window w) { return fmt("window (%d, %d)", w.left, w.right); }

inline bool ref_visible(long i, long j, long seqlen_q, long seqlen_k, Window w) {
  if (j < 0 || j >= seqlen_k) return false;
  const long diag = i + seqlen_k - seqlen_q;  // the key on row i's diagonal
  if (w.right >= 0 && j > diag + w.right) return false;
  if (w.left >= 0 && j < diag - w.left) return false;
  return true;
}

bool header_visible(int i, int j, int seqlen_q, int seqlen_k, Window w = {}) {
  return FwdMask{seqlen_q, seqlen_k, w}.key_visible(i, j);
}

// mask: FwdMask::key_visible agrees with ref_visible, rows past seqlen_q included.
void test_mask() {
  long mismatches = 0;
  for (Window w : kWindows) {
    for (int sq = 0; sq <= 40; ++sq) {
      for (int sk = 0; sk <= 40; ++sk) {
        for (int i = 0; i < sq + 20; ++i) {
          for (int j = 0; j < sk + 20; ++j) {
            const bool want = ref_visible(i, j, sq, sk, w);
            const bool got = header_visible(i, j, sq, sk, w);
            if (want != got && ++mismatches <= 5) {
              CHECK(want == got, fmt("key_visible(row %d, col %d) seqlen_q %d seqlen_k %d ", i, j, sq, sk) +
                                     window_str(w) + fmt(": got %d", got));
            }
          }
          int want_count = 0;
          for (int j = 0; j < sk; ++j) want_count += ref_visible(i, j, sq, sk, w);
          const int got_count = FwdMask{sq, sk, w}.key_count(i);
          if (want_count != got_count && ++mismatches <= 5) {
            CHECK(want_count == got_count, fmt("key_count(row %d) seqlen_q %d seqlen_k %d ", i, sq, sk) +
                                               window_str(w) + fmt(": got %d, want %d", got_count, want_count));
          }
        }
      }
    }
  }
  // A few spot values, hand-checked.
  const Window causal{-1, 0};
  CHECK(header_visible(0, 0, 4, 4, causal), "causal square: row 0 sees key 0");
  CHECK(!header_visible(0, 1, 4, 4, causal), "causal square: row 0 does not see key 1");
  CHECK(header_visible(0, 2, 2, 4, causal), "causal, seqlen_k - seqlen_q = 2: row 0 sees key 2");
  CHECK(!header_visible(0, 0, 4, 2, causal), "causal, seqlen_q > seqlen_k: row 0 sees nothing");
  CHECK(header_visible(2, 0, 4, 2, causal), "causal, seqlen_q > seqlen_k: row 2 sees key 0");
  CHECK(!header_visible(0, 4, 4, 4), "non-causal: key seqlen_k is out of range");
  CHECK(header_visible(100, 3, 4, 4), "non-causal: a row past seqlen_q sees every key");
  CHECK(!header_visible(10, 7, 16, 16, {2, 0}), "window (2, 0): row 10 does not see key 7");
  CHECK(header_visible(10, 8, 16, 16, {2, 0}), "window (2, 0): row 10 sees key 8");
  CHECK(!header_visible(10, 12, 16, 16, {2, 1}), "window (2, 1): row 10 does not see key 12");
  CHECK(header_visible(0, 4, 4, 8, {0, 0}), "window (0, 0), seqlen_k - seqlen_q = 4: row 0 sees key 4");
  CHECK(!header_visible(0, 3, 4, 8, {0, 0}), "window (0, 0), seqlen_k - seqlen_q = 4: row 0 misses key 3");
  if (mismatches == 0) ++g_passed;
}

// ----------------------------------------------------------------------------------------------
// n_block_range: fwd_n_block_range against brute force over every (row, key) pair.

std::vector<int> seqlen_values(int block_m, int block_n) {
  // Every length up to a bit past the smaller block (at most 66), the lengths around each block
  // boundary up to three of the larger block, and a sparse sweep up to 300.
  const int big = std::max(block_m, block_n);
  const int small = std::min({block_m, block_n, 64});
  std::vector<bool> take(301, false);
  for (int s = 0; s <= 300 && s <= small + 2; ++s) take[s] = true;
  for (int s = 0; s <= 300; s += 37) take[s] = true;
  for (int b : {block_m, block_n}) {
    for (int m = b; m <= 3 * big && m - 1 <= 300; m += b) {
      for (int s = m - 1; s <= m + 1 && s <= 300; ++s) take[s] = true;
    }
  }
  take[300] = true;
  std::vector<int> out;
  for (int s = 0; s <= 300; ++s) {
    if (take[s]) out.push_back(s);
  }
  return out;
}

// Checks one (query block, sizes, window) against brute force over its real rows (< seqlen_q: rows
// past it are never output). Returns false on the first failing property (already recorded).
bool check_range(int block_m, int block_n, int sq, int sk, Window w, int m_block, std::vector<unsigned char>& any_vis,
                 std::vector<unsigned char>& any_invis) {
  const NBlockRange r = fwd_n_block_range(m_block, block_m, block_n, sq, sk, w);
  const std::string where = fmt("fwd_n_block_range(m_block=%d, block_m=%d, block_n=%d, seqlen_q=%d, seqlen_k=%d, ",
                                m_block, block_m, block_n, sq, sk) +
                            window_str(w) + fmt(") = {min %d, max %d, masked %d, unmasked_min %d}", r.n_block_min,
                                                r.n_block_max, r.n_masked_steps, r.n_block_unmasked_min);
  // Scan every key block of seqlen_k and one past it (keys >= seqlen_k are invisible under the rule,
  // so blocks further out are empty; a range reaching them fails the [lo, hi) comparison below).
  const int n_scan = (sk + block_n - 1) / block_n + 1;
  any_vis.assign(n_scan, 0);
  any_invis.assign(n_scan, 0);
  const int row0 = m_block * block_m;
  const int row_end = std::min(row0 + block_m, sq);
  for (int nb = 0; nb < n_scan; ++nb) {
    // Every (row, key) pair of the block, stopping once it is known to hold both kinds.
    for (int i = row0; i < row_end && !(any_vis[nb] && any_invis[nb]); ++i) {
      for (int j = nb * block_n; j < (nb + 1) * block_n && !(any_vis[nb] && any_invis[nb]); ++j) {
        (ref_visible(i, j, sq, sk, w) ? any_vis[nb] : any_invis[nb]) = 1;
      }
    }
  }
  int lo = -1, hi = -1;  // the visible blocks, [lo, hi)
  for (int nb = 0; nb < n_scan; ++nb) {
    if (any_vis[nb]) {
      if (lo < 0) lo = nb;
      hi = nb + 1;
    }
  }
  if (lo < 0) {
    // No row of the block sees any key: the range must be empty.
    if (!(r.n_block_max <= r.n_block_min)) {
      CHECK(r.n_block_max <= r.n_block_min, where + ": no visible pair, yet the range is non-empty");
      return false;
    }
    return true;
  }
  for (int nb = lo; nb < hi; ++nb) {
    if (!any_vis[nb]) {
      CHECK(any_vis[nb], where + fmt(": the visible blocks are not contiguous (block %d is empty)", nb));
      return false;
    }
  }
  if (r.n_block_min != lo || r.n_block_max != hi) {
    CHECK(r.n_block_min == lo && r.n_block_max == hi,
          where + fmt(": blocks holding a visible pair are [%d, %d)", lo, hi));
    return false;
  }
  if (r.n_masked_steps < 0 || r.n_masked_steps > r.n_block_max - r.n_block_min ||
      r.n_block_unmasked_min < r.n_block_min || r.n_block_unmasked_min > r.n_block_max) {
    CHECK(false, where + ": n_masked_steps or n_block_unmasked_min out of the range");
    return false;
  }
  for (int nb = r.n_block_min; nb < r.n_block_max; ++nb) {
    if (r.is_masked(nb) != bool(any_invis[nb])) {
      CHECK(false, where + fmt(": block %d runs %s but %s an invisible pair", nb, r.is_masked(nb) ? "masked" : "unmasked",
                               any_invis[nb] ? "holds" : "holds no"));
      return false;
    }
  }
  return true;
}

// Calls check(block_m, block_n, seqlen_q, seqlen_k, window) for every tile shape, window and pair
// of seqlen_values; returns the number of calls that returned false and adds to n_cases.
template <class Check>
long count_failures(std::vector<std::pair<int, int>> const& blocks, long& n_cases, Check check) {
  long n_bad = 0;
  for (const auto& [block_m, block_n] : blocks) {
    const std::vector<int> values = seqlen_values(block_m, block_n);
    for (Window w : kWindows) {
      for (int sq : values) {
        for (int sk : values) n_bad += check(block_m, block_n, sq, sk, w, n_cases);
      }
    }
  }
  return n_bad;
}

void test_n_block_range() {
  std::vector<unsigned char> any_vis, any_invis;
  long n_cases = 0;
  const long n_bad = count_failures({{128, 64}, {128, 128}, {64, 64}, {16, 16}}, n_cases,
                                    [&](int block_m, int block_n, int sq, int sk, Window w, long& cases) {
                                      long bad = 0;
                                      for (int m_block = 0; m_block * block_m < sq; ++m_block, ++cases) {
                                        bad += !check_range(block_m, block_n, sq, sk, w, m_block, any_vis, any_invis);
                                      }
                                      return bad;
                                    });
  // Hand-checked values (bottom-right aligned causal).
  {
    // Square 256 x 256, 128 x 64 tiles, m_block 1: rows 128..255 see keys up to 255 -> 4 blocks;
    // row 128 sees keys 0..128 -> blocks 0, 1 fully visible, 2 and 3 masked.
    const NBlockRange r = fwd_n_block_range(1, 128, 64, 256, 256, Window{-1, 0});
    CHECK_EQ(r.n_block_min, 0, "causal 256x256 m_block 1: n_block_min");
    CHECK_EQ(r.n_block_max, 4, "causal 256x256 m_block 1: n_block_max");
    CHECK_EQ(r.n_masked_steps, 2, "causal 256x256 m_block 1: n_masked_steps");
  }
  {
    // seqlen_q 300 > seqlen_k 100, causal: rows 0..199 see nothing, so m_block 0 is empty.
    const NBlockRange r = fwd_n_block_range(0, 128, 64, 300, 100, Window{-1, 0});
    CHECK(r.n_block_max <= r.n_block_min, "causal seqlen_q 300, seqlen_k 100, m_block 0 sees nothing");
  }
  {
    // Non-causal, seqlen_k 130, block_n 64: blocks 0, 1 full, block 2 ragged -> 3 blocks, 1 masked.
    const NBlockRange r = fwd_n_block_range(0, 128, 64, 1, 130, Window{});
    CHECK_EQ(r.n_block_max, 3, "non-causal seqlen_k 130: n_block_max");
    CHECK_EQ(r.n_masked_steps, 1, "non-causal seqlen_k 130: n_masked_steps");
  }
  {
    const NBlockRange r = fwd_n_block_range(0, 128, 64, 7, 0, Window{});
    CHECK(r.n_block_max <= r.n_block_min, "seqlen_k 0: nothing to visit");
  }
  static_assert(fwd_n_block_range(0, 128, 64, 128, 128, Window{}).n_block_max == 2,
                "fwd_n_block_range is usable in constant expressions");
  std::printf("  n_block_range: %ld (query block, sizes) cases, %ld failing\n", n_cases, n_bad);
  if (n_bad == 0) ++g_passed;
}

// ----------------------------------------------------------------------------------------------
// m_block_range: bwd_m_block_range against brute force, and against fwd_n_block_range.
// The backward masks a (row block, key block) pair iff a real row (< seqlen_q) of it fails to see
// a key position of it (keys past seqlen_k included: their K rows are zeros, not -inf). Rows past
// seqlen_q need no mask (their LSE is +inf). The deterministic dQ order needs, for every row
// block, the key blocks that visit it to be exactly [fwd n_block_min, fwd n_block_max).

bool check_m_range(int block_m, int block_n, int sq, int sk, Window w, int n_block) {
  const MBlockRange r = bwd_m_block_range(n_block, block_m, block_n, sq, sk, w);
  const std::string where = fmt("bwd_m_block_range(n_block=%d, block_m=%d, block_n=%d, seqlen_q=%d, seqlen_k=%d, ",
                                n_block, block_m, block_n, sq, sk) +
                            window_str(w) + fmt(") = {min %d, max %d, masked %d, unmasked_max %d}", r.m_block_min,
                                                r.m_block_max, r.n_masked_steps, r.m_block_unmasked_max);
  const int m_blocks = (sq + block_m - 1) / block_m;
  for (int mb = 0; mb < m_blocks; ++mb) {
    bool any_vis = false, any_invis = false;
    for (int i = mb * block_m; i < std::min((mb + 1) * block_m, sq); ++i) {
      for (int j = n_block * block_n; j < (n_block + 1) * block_n; ++j) {
        (ref_visible(i, j, sq, sk, w) ? any_vis : any_invis) = true;
      }
    }
    const bool in_range = mb >= r.m_block_min && mb < r.m_block_max;
    const NBlockRange f = fwd_n_block_range(mb, block_m, block_n, sq, sk, w);
    const bool fwd_visits = n_block >= f.n_block_min && n_block < f.n_block_max;
    if (in_range != any_vis || fwd_visits != in_range) {
      CHECK(false, where + fmt(": row block %d: in range %d, holds a visible pair %d, forward visits %d", mb,
                               in_range, any_vis, fwd_visits));
      return false;
    }
    if (!in_range) continue;
    if (r.is_masked(mb) != any_invis) {
      CHECK(false, where + fmt(": row block %d runs %s but %s an invisible pair", mb,
                               r.is_masked(mb) ? "masked" : "unmasked", any_invis ? "holds" : "holds no"));
      return false;
    }
  }
  return true;
}

void test_m_block_range() {
  long n_cases = 0;
  const long n_bad = count_failures({{64, 128}, {128, 128}, {64, 64}, {16, 32}}, n_cases,
                                    [](int block_m, int block_n, int sq, int sk, Window w, long& cases) {
                                      long bad = 0;
                                      for (int n_block = 0; n_block * block_n < sk + block_n; ++n_block, ++cases) {
                                        bad += !check_m_range(block_m, block_n, sq, sk, w, n_block);
                                      }
                                      return bad;
                                    });
  {
    // Square 256 x 256, causal, 64 x 128 tiles, key block 1 (keys 128..255): row blocks 2, 3 see it;
    // block 2 (rows 128..191) misses keys 192..255, block 3 misses some too -> both masked.
    const MBlockRange r = bwd_m_block_range(1, 64, 128, 256, 256, Window{-1, 0});
    CHECK_EQ(r.m_block_min, 2, "causal 256x256 n_block 1: m_block_min");
    CHECK_EQ(r.m_block_max, 4, "causal 256x256 n_block 1: m_block_max");
    CHECK_EQ(r.n_masked_steps, 2, "causal 256x256 n_block 1: n_masked_steps");
  }
  {
    // A key block past seqlen_k sees nothing; a ragged last key block runs every step masked.
    CHECK(bwd_m_block_range(2, 64, 128, 100, 256, Window{}).m_block_max <= 0, "key block past seqlen_k");
    const MBlockRange r = bwd_m_block_range(1, 64, 128, 200, 130, Window{});
    CHECK_EQ(r.m_block_max - r.m_block_min, 4, "ragged key block: every row block");
    CHECK_EQ(r.n_masked_steps, 4, "ragged key block: all masked");
  }
  std::printf("  m_block_range: %ld (key block, sizes) cases, %ld failing\n", n_cases, n_bad);
  if (n_bad == 0) ++g_passed;
}

// dq_order: the deterministic backward's dQ order (block_info.h) along bwd_walk_row_block, the
// walk bwd_kernel.h takes. Rotated: with every key block of a head starting together and taking one
// row block per step, a key block must find its turn at every row block it reaches (no wait), and
// each row block must take every key block once. Otherwise each row block's chain, from
// dq_first_key_block along dq_next_key_block, must be exactly the key blocks that visit it,
// ascending, and key block n must reach every row block no later than key block n + 1. The
// default walk must visit every row block of the range once.
bool check_rotated_order(int m_count, int n_count) {
  const int block_m = 64, block_n = 128, seqlen_q = m_count * block_m - 5, seqlen_k = n_count * block_n - 3;
  const std::string where = fmt("rotated dQ order, %d key blocks, %d row blocks: ", n_count, m_count);
  if (!dq_rotated(true, Window{}, n_count, m_count)) {
    CHECK(false, where + "not rotated");
    return false;
  }
  std::vector<int> turn(m_count), visits(m_count, 0);
  for (int m = 0; m < m_count; ++m) turn[m] = dq_first_key_block(m, block_m, block_n, seqlen_q, seqlen_k, Window{}, true);
  for (int step = 0; step < m_count; ++step) {
    std::vector<int> m_block(n_count);
    for (int n = 0; n < n_count; ++n) {
      const MBlockRange range = bwd_m_block_range(n, block_m, block_n, seqlen_q, seqlen_k, Window{});
      m_block[n] = bwd_walk_row_block(step, range, n, true, true);
      if (m_block[n] < 0 || m_block[n] >= m_count || turn[m_block[n]] != n) {
        CHECK(false, where + fmt("key block %d at row block %d in step %d: turn of %d", n, m_block[n], step,
                                 m_block[n] < 0 || m_block[n] >= m_count ? -1 : turn[m_block[n]]));
        return false;
      }
    }
    for (int n = 0; n < n_count; ++n) {  // hand on at the next barrier
      turn[m_block[n]] = dq_next_key_block(n, n_count, true);
      ++visits[m_block[n]];
    }
  }
  for (int m = 0; m < m_count; ++m) {
    if (visits[m] != n_count) {
      CHECK(false, where + fmt("row block %d visited %d times", m, visits[m]));
      return false;
    }
  }
  return true;
}

bool check_ascending_order(int block_m, int block_n, int sq, int sk, Window w, bool dq_rotate) {
  const std::string where = fmt("dQ order, seqlen_q %d, seqlen_k %d, tiles %d x %d, ", sq, sk, block_m, block_n) +
                            window_str(w) + (dq_rotate ? ", rotate asked: " : ": ");
  const int m_count = ceil_div(sq, block_m), n_count = ceil_div(sk, block_n);
  if (dq_rotated(dq_rotate, w, n_count, m_count)) return true;  // check_rotated_order's case
  for (int m = 0; m < m_count; ++m) {
    int n = dq_first_key_block(m, block_m, block_n, sq, sk, w, dq_rotate);
    for (int v = 0; v < n_count; ++v) {
      const MBlockRange r = bwd_m_block_range(v, block_m, block_n, sq, sk, w);
      if (m < r.m_block_min || m >= r.m_block_max) continue;
      if (n != v) {
        CHECK(false, where + fmt("row block %d: key block %d visits it, but the turn goes to %d", m, v, n));
        return false;
      }
      n = dq_next_key_block(n, n_count, false);
    }
  }
  std::vector<int> prev_step(m_count, -1);  // the step in which the key blocks so far reached each row block
  for (int v = 0; v < n_count; ++v) {
    const MBlockRange r = bwd_m_block_range(v, block_m, block_n, sq, sk, w);
    std::vector<int> seen(m_count, 0);
    for (int i = 0; i < r.m_block_max - r.m_block_min; ++i) {
      const int m = bwd_walk_row_block(i, r, v, true, false);
      const int up = bwd_walk_row_block(i, r, v, false, false);
      if (m < r.m_block_min || m >= r.m_block_max || up < r.m_block_min || up >= r.m_block_max || seen[m]++ ||
          i < prev_step[m]) {
        CHECK(false, where + fmt("key block %d, step %d: row block %d (upward %d) out of range, twice, or reached "
                                 "before an earlier key block (step %d)", v, i, m, up, prev_step[m]));
        return false;
      }
      prev_step[m] = i;
    }
  }
  return true;
}

void test_dq_order() {
  long n_cases = 0, n_bad = 0;
  for (int m_count = 1; m_count <= 40; ++m_count) {
    for (int n_count = 1; n_count <= m_count; ++n_count, ++n_cases) n_bad += !check_rotated_order(m_count, n_count);
  }
  const Window windows[] = {{-1, 0}, {-1, -1}, {37, 0}, {100, 5}, {0, 0}, {300, -1}, {-1, 70}};
  for (int sq : {1, 113, 640, 1023}) {
    for (int sk : {1, 127, 640, 2048}) {
      for (Window w : windows) {
        for (auto [block_m, block_n] : {std::pair{64, 128}, {128, 128}, {64, 64}}) {
          for (bool dq_rotate : {false, true}) {
            ++n_cases;
            n_bad += !check_ascending_order(block_m, block_n, sq, sk, w, dq_rotate);
          }
        }
      }
    }
  }
  std::printf("  dq_order: %ld cases, %ld failing\n", n_cases, n_bad);
  if (n_bad == 0) ++g_passed;
}

// bwd_tile: the backward's tile table fits the SM (Q and dO double-buffered, K, V, P, dS: 2 bytes an
// element) and its warp layouts divide the tiles.
// The SM80 backward's tiles, default and small (bwd_small_smem: sm_86 / sm_89 allow 99 KB a block up
// to head dim 192, sm_80 163 KB, Hopper 227 KB).
void test_bwd_tile_table() {
  constexpr int kSm86 = 99 * 1024, kSm80 = 163 * 1024, kSm90 = 227 * 1024;
  for (int d : kFwdHeadDims) {
    for (int kind : {0, 1, 2}) {  // default, small, V in registers (head dim 256 only)
      if (kind == 2 && d != 256) continue;
      const bool small = kind > 0;
      const BwdTileShape t = kind == 2 ? bwd_v_in_regs_tile_shape() : bwd_tile_shape(d, small);
      const std::string where = fmt("bwd hdim %d%s: tile (%d, %d, %d warps, %d Q slots)", d,
                                    kind == 2 ? " V in registers" : small ? " small" : "", t.block_m, t.block_n,
                                    t.n_warps, t.q_slots);
      CHECK_EQ(t.v_in_regs, kind == 2, where + ": v_in_regs");
      // With V in registers, P and dS fit in V's shared memory.
      CHECK(!t.v_in_regs || 2 * t.block_m * t.block_n <= t.block_n * d, where + ": P and dS exceed V's tile");
      const long p_ds = t.v_in_regs ? 0 : 2L * t.block_m * t.block_n;
      const long smem = (2L * t.q_slots * t.block_m * d + 2L * t.block_n * d + p_ds) * 2 + t.q_slots * 8L * t.block_m + 24;
      CHECK_EQ(long(bwd_smem_bytes(t, d)), smem, where + ": bwd_smem_bytes");
      const long limit = !small ? kSm90 : d <= 192 || kind == 2 ? kSm86 : kSm80;
      CHECK(smem <= limit, where + fmt(": %ld bytes of shared memory > %ld", smem, limit));
      CHECK(t.q_slots == 1 || t.q_slots == 2, where + ": Q slots");
      CHECK(2 * t.block_m <= 32 * t.n_warps, where + ": one thread per row for LSE and one for D");
      CHECK(t.n_warps % t.atom_m_sdp == 0 && t.n_warps % t.atom_n_dkv == 0 && t.n_warps % t.atom_m_dq == 0,
            where + ": warp layouts do not divide n_warps");
      // Dropout's warps take 32 whole key columns each; the V-in-registers tile (no dropout) 16.
      const int warp_cols = t.v_in_regs ? 16 : 32;
      CHECK(t.block_m % (16 * t.atom_m_sdp) == 0 && t.block_n % (warp_cols * (t.n_warps / t.atom_m_sdp)) == 0,
            where + ": S / dP tile not divisible by its warp layout");
      CHECK(t.block_n % (16 * t.atom_n_dkv) == 0 && d % (16 * (t.n_warps / t.atom_n_dkv)) == 0,
            where + ": dK / dV tile not divisible by its warp layout");
      CHECK(t.block_m % (16 * t.atom_m_dq) == 0 && d % (16 * (t.n_warps / t.atom_m_dq)) == 0,
            where + ": dQ tile not divisible by its warp layout");
    }
    const std::string where = fmt("bwd hdim %d", d);
    CHECK(!bwd_small_smem(d, kSm90), where + ": small tiles on Hopper");
    CHECK_EQ(bwd_small_smem(d, kSm80), d == 256, where + ": small tiles on sm_80");
    CHECK(bwd_small_smem(d, kSm86), where + ": no small tiles on sm_86");
    CHECK_EQ(bwd_smem_bytes(bwd_tile_shape(d, true), d) <= kSm86, d <= 192, where + ": small tiles within sm_86's limit");
    // bwd_tile_for: the tile a call runs on, within every GPU's limit but for dropout at 256 on sm_86.
    for (Variant v : {Variant::kPlain, Variant::kScoreMods, Variant::kDropout}) {
      const std::string wv = where + fmt(" variant %d", int(v));
      const bool v_in_regs = d == 256 && v != Variant::kDropout;
      CHECK(!bwd_v_in_regs(d, v, kSm90) && !bwd_v_in_regs(d, v, kSm80), wv + ": V in registers above sm_86's limit");
      CHECK_EQ(bwd_v_in_regs(d, v, kSm86), v_in_regs, wv + ": bwd_v_in_regs on sm_86");
      CHECK_EQ(bwd_tile_for(d, v, kSm90).block_n, bwd_tile_shape(d).block_n, wv + ": bwd_tile_for on Hopper");
      CHECK_EQ(bwd_tile_for(d, v, 0).block_n, bwd_tile_shape(d).block_n, wv + ": bwd_tile_for, limit unknown");
      CHECK_EQ(bwd_tile_for(d, v, kSm80).q_slots, bwd_tile_shape(d, d == 256).q_slots, wv + ": bwd_tile_for on sm_80");
      CHECK_EQ(bwd_tile_for(d, v, kSm86).v_in_regs, v_in_regs, wv + ": bwd_tile_for on sm_86");
      CHECK_EQ(bwd_smem_bytes(bwd_tile_for(d, v, kSm86), d) <= kSm86, d < 256 || v_in_regs,
               wv + ": bwd_tile_for within sm_86's limit");
    }
  }
}

// dq_accum: BlockInfo::dq_accum_offset for the padded accumulator layouts of BwdParams.
void test_dq_accum_offset() {
  {
    // Dense (batch 3, heads 4, seqlen_q 100 -> 128 rows, rows of 72 floats): strides 4*128*72,
    // 128*72, 72.
    BwdParams p;
    p.seqlen_q = 100;
    p.dq_accum_batch_stride = 4L * 128 * 72;
    p.dq_accum_head_stride = 128 * 72;
    p.dq_accum_row_stride = 72;
    const BlockInfo bi(p, 2);
    CHECK_EQ(bi.dq_accum_offset(p, 2, 3), 2L * 36864 + 3 * 9216, "dense: dq_accum_offset(b 2, h 3)");
  }
  {
    // Varlen, block_m 64: sequence b starts at row cu_seqlens_q[b] + 64 b; the last row of a
    // sequence's last row block stays below the next sequence's first row.
    const int cu_q[] = {0, 1, 65, 65, 200};
    BwdParams p;
    p.batch = 4;
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = cu_q;
    p.seqlen_q = p.seqlen_k = 135;  // max_seqlen
    p.total_q = p.total_k = 200;
    // (heads 2, 200 + 4 * 64 rows, rows of 136 floats)
    p.dq_accum_row_stride = 136;
    p.dq_accum_head_stride = (200 + 4 * 64) * 136;
    p.dq_accum_varlen_pad = 64;
    for (int b = 0; b < 4; ++b) {
      const BlockInfo bi(p, b);
      const index_t row0 = bi.dq_accum_offset(p, b, 0) / p.dq_accum_row_stride;
      CHECK_EQ(row0, cu_q[b] + 64L * b, fmt("varlen b %d: first row", b));
      const index_t padded_end = row0 + (bi.seqlen_q + 63) / 64 * 64;
      if (b + 1 < 4) {
        const BlockInfo next(p, b + 1);
        CHECK(padded_end <= next.dq_accum_offset(p, b + 1, 0) / p.dq_accum_row_stride,
              fmt("varlen b %d: padded rows overlap the next sequence", b));
      }
      CHECK(padded_end <= 200 + 4L * 64, fmt("varlen b %d: padded rows past total_q + batch * block_m", b));
    }
    CHECK_EQ(BlockInfo(p, 1).dq_accum_offset(p, 1, 1), (1 + 64L) * 136 + (200 + 4 * 64) * 136,
             "varlen: dq_accum_offset(b 1, h 1)");
  }
}

// dq_fragment, for one kernel head dim D: the atomics path's fragment order (dq_fragment_offset)
// puts every value of the tile's dQ fragments at its own float of the row block's accumulator tile,
// [0, block_m * D), the block_m rows the tile owns, and a warp's 32 lanes add one pair
// index to 64 contiguous floats. The kernel's dQ MMA partition (TiledMmadQ), through which the main
// kernel adds its fragments and bwd_convert_dq_fragments_kernel reads them back: every thread's
// fragment is compact, holds its values in pairs (i, i + 1), i even, of adjacent columns (c, c + 1),
// c even, of one row, and the threads' fragments cover each (row, col) of the tile once; and, as
// the conversion reads 8 floats of the order at a time, pair i of threads 4q .. 4q + 3 holds columns
// c .. c + 7, c a multiple of 8, of one row. Traits: the SM80 backward's and the Hopper backward's
// (whose dQ MMA with 64 rows at head dims 32 and 96 is one warpgroup's: kDqThreads, each warpgroup
// adding its keys' part).
template <class Traits>
void check_dq_fragment(std::string const& where) {
  constexpr int D = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kThreads = Traits::kDqThreads;
  constexpr int kFloats = kBlockM * D;
  constexpr int kVec = Traits::kDqVec;  // values a group

  CHECK(kFloats % (kVec * kThreads) == 0, where + ": dQ tile not a whole number of groups per thread");
  CHECK(kFloats <= kBlockM * dq_accum_row_floats(D), where + ": fragment order overflows the tile's rows");
  std::vector<int> seen(kFloats, 0);
  for (int group = 0; group < kFloats / (kVec * kThreads); ++group) {
    for (int warp = 0; warp < kThreads / 32; ++warp) {
      const int first = dq_fragment_offset(group, 32 * warp, kThreads, kVec);
      for (int lane = 0; lane < 32; ++lane) {
        const int offset = dq_fragment_offset(group, 32 * warp + lane, kThreads, kVec);
        CHECK_EQ(offset, first + kVec * lane,
                 where + fmt(": group %d warp %d lane %d not contiguous", group, warp, lane));
        for (int v = 0; v < kVec; ++v) {
          if (offset >= 0 && offset + v < kFloats) ++seen[offset + v];
        }
      }
    }
  }
  for (int f = 0; f < kFloats; ++f) {
    CHECK_EQ(seen[f], 1, where + fmt(": float %d of the tile added %d times", f, seen[f]));
    if (seen[f] != 1) break;
  }

  typename Traits::TiledMmadQ mma_dq;
  auto tile_mk = Shape<Int<kBlockM>, Int<D>>{};
  auto acc = partition_fragment_C(mma_dq, tile_mk);
  CHECK_EQ(int(size(acc)) * kThreads, kFloats, where + ": dQ fragments do not split the tile");
  std::vector<int> covered(kFloats, 0);
  for (int t = 0; t < kThreads; ++t) {
    auto coords = mma_dq.get_thread_slice(t).partition_C(make_identity_tensor(tile_mk));
    for (int i = 0; i < size(acc); ++i) {
      const int row = get<0>(coords(i)), col = get<1>(coords(i));
      CHECK_EQ(int(acc.layout()(i)), i, where + ": dQ fragment not compact");
      if (i % 2 == 1) {
        const int row0 = get<0>(coords(i - 1)), col0 = get<1>(coords(i - 1));
        CHECK(row0 == row && col0 % 2 == 0 && col0 + 1 == col,
              where + fmt(": thread %d values %d, %d not adjacent columns of a row", t, i - 1, i));
      }
      if (row >= 0 && row < kBlockM && col >= 0 && col < D) ++covered[row * D + col];
    }
  }
  for (int f = 0; f < kFloats; ++f) {
    CHECK_EQ(covered[f], 1, where + fmt(": (row %d, col %d) in %d fragments", f / D, f % D, covered[f]));
    if (covered[f] != 1) break;
  }
  // What bwd_convert_dq_fragments_kernel reads as 8 consecutive floats: pairs, group i of threads
  // q .. q + 3 (q a multiple of 4) holds 8 columns of a row, from a multiple of 8; groups of 4, values
  // i, i + 1 of threads q, q + 1 (q even) hold 4 columns of a row, from a multiple of 4, and values
  // i + 2, i + 3 the same columns of another row.
  constexpr int kSlots = 8 / kVec;
  for (int q = 0; q < kThreads; q += kSlots) {
    auto lead = mma_dq.get_thread_slice(q).partition_C(make_identity_tensor(tile_mk));
    for (int i = 0; i < size(acc); i += kVec) {
      for (int h = 0; h < kVec / 2; ++h) {
        const int row = get<0>(lead(i + 2 * h)), col = get<1>(lead(i + 2 * h));
        for (int t = 0; t < kSlots; ++t) {
          auto coords = mma_dq.get_thread_slice(q + t).partition_C(make_identity_tensor(tile_mk));
          CHECK(get<0>(coords(i + 2 * h)) == row && get<1>(coords(i + 2 * h)) == col + 2 * t && col % (2 * kSlots) == 0 &&
                    get<1>(lead(i + 2 * h)) == get<1>(lead(i)),
                where + fmt(": group %d of threads %d .. %d not the converter's columns", i / kVec, q, q + kSlots - 1));
        }
      }
    }
  }
}

// The dropout variant's dQ = dS K (A K-major from the rows' dS) lands in the same fragment order
// as TiledMmadQ's, which DqAccumulator and check_dq_fragment assume.
template <class Traits>
void check_dq_rows_fragment(std::string const& where) {
  check_dq_fragment<Traits>(where);
  typename Traits::TiledMmadQ mma_dq;
  typename Traits::TiledMmadQRows mma_dq_rows;
  auto tile_mk = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{};
  CHECK_EQ(int(size(partition_fragment_C(mma_dq_rows, tile_mk))), int(size(partition_fragment_C(mma_dq, tile_mk))),
           where + ": rows dQ fragment size");
  int bad = 0;
  for (int t = 0; t < Traits::kDqThreads; ++t) {
    auto coords = mma_dq.get_thread_slice(t).partition_C(make_identity_tensor(tile_mk));
    auto coords_rows = mma_dq_rows.get_thread_slice(t).partition_C(make_identity_tensor(tile_mk));
    for (int i = 0; i < size(coords); ++i) {
      bad += get<0>(coords(i)) != get<0>(coords_rows(i)) || get<1>(coords(i)) != get<1>(coords_rows(i));
    }
  }
  CHECK_EQ(bad, 0, where + ": rows dQ fragments not TiledMmadQ's");
}

template <size_t... I>
void check_dq_fragments(std::index_sequence<I...>) {
  (check_dq_fragment<BwdKernelTraits<kFwdHeadDims[I], cutlass::bfloat16_t>>(fmt("bwd hdim %d", kFwdHeadDims[I])), ...);
  (check_dq_fragment<BwdKernelTraits<kFwdHeadDims[I], cutlass::bfloat16_t, true>>(
       fmt("bwd hdim %d, small tiles", kFwdHeadDims[I])),
   ...);
  check_dq_fragment<BwdKernelTraits<256, cutlass::bfloat16_t, true, true>>("bwd hdim 256, V in registers");
}

void test_dq_fragment() {
  // The Hopper backward's query rows a step (bwd_sm90_block_m): 128 up to head dim 64 but, at 64,
  // softcap's dropout kernel.
  static_assert(bwd_sm90_block_m(64, Variant::kPlain) == 128 && bwd_sm90_block_m(96, Variant::kPlain) == 64);
  static_assert(bwd_sm90_block_m(64, Variant::kScoreMods, Sm90BwdCap::kCap) == 128);
  static_assert(bwd_sm90_block_m(32, Variant::kScoreMods, Sm90BwdCap::kCapAlibi) == 128 &&
                bwd_sm90_block_m(64, Variant::kScoreMods, Sm90BwdCap::kCapAlibi) == 128);
  static_assert(bwd_sm90_block_m(64, Variant::kDropout) == 128 && bwd_sm90_block_m(32, Variant::kDropout, Sm90BwdCap::kCap) == 128);
  static_assert(bwd_sm90_block_m(64, Variant::kDropout, Sm90BwdCap::kCap) == 64);
  check_dq_fragments(std::make_index_sequence<std::size(kFwdHeadDims)>{});
  check_dq_fragment<BwdKernelTraitsSm90<32, cutlass::bfloat16_t>>("Hopper bwd hdim 32");
  check_dq_fragment<BwdKernelTraitsSm90<64, cutlass::bfloat16_t>>("Hopper bwd hdim 64");
  check_dq_fragment<BwdKernelTraitsSm90<96, cutlass::bfloat16_t>>("Hopper bwd hdim 96 (dQ split by keys)");
  check_dq_fragment<BwdKernelTraitsSm90<128, cutlass::bfloat16_t>>("Hopper bwd hdim 128");
  check_dq_rows_fragment<BwdKernelTraitsSm90<32, cutlass::bfloat16_t, bwd_sm90_block_m(32, Variant::kDropout)>>(
      "Hopper bwd hdim 32, dropout");
  check_dq_rows_fragment<BwdKernelTraitsSm90<64, cutlass::bfloat16_t, bwd_sm90_block_m(64, Variant::kDropout)>>(
      "Hopper bwd hdim 64, dropout");
  check_dq_rows_fragment<
      BwdKernelTraitsSm90<64, cutlass::bfloat16_t, bwd_sm90_block_m(64, Variant::kDropout, Sm90BwdCap::kCap)>>(
      "Hopper bwd hdim 64, dropout + softcap (64 query rows)");
  check_dq_rows_fragment<BwdKernelTraitsSm90<96, cutlass::bfloat16_t, bwd_sm90_block_m(96, Variant::kDropout)>>(
      "Hopper bwd hdim 96, dropout");
  check_dq_rows_fragment<BwdKernelTraitsSm90<128, cutlass::bfloat16_t, bwd_sm90_block_m(128, Variant::kDropout)>>(
      "Hopper bwd hdim 128, dropout");
  // Past 128 every step has queries as rows (kSplitHeadDim).
  check_dq_rows_fragment<BwdKernelTraitsSm90<192, cutlass::bfloat16_t>>("Hopper bwd hdim 192");
  check_dq_rows_fragment<BwdKernelTraitsSm90<256, cutlass::half_t>>("Hopper bwd hdim 256");
}

// ----------------------------------------------------------------------------------------------
// split_kv: the split heuristic, the key blocks of each split, and the combine math.

// The heuristic's rule, written independently: the smallest useful split count whose efficiency is
// within 95 % of the best one's.
int ref_num_splits(int ctas, int num_sms, int n_blocks, int max_splits) {
  if (ctas <= 0 || num_sms <= 0 || n_blocks <= 1 || ctas * 10 >= num_sms * 8) return 1;
  const int limit = std::min({max_splits, num_sms, n_blocks, kMaxSplits});
  std::vector<double> eff(limit + 1, -1.0);
  double best = 0.0;
  for (int s = 1; s <= limit; ++s) {
    const long blocks_now = (n_blocks + s - 1) / s, blocks_before = s > 1 ? (n_blocks + s - 2) / (s - 1) : -1;
    if (s > 1 && blocks_now == blocks_before) continue;
    const double waves = double(ctas) * s / num_sms;
    eff[s] = waves / std::ceil(waves - 1e-9);
    best = std::max(best, eff[s]);
  }
  for (int s = 1; s <= limit; ++s) {
    if (eff[s] >= 0 && eff[s] >= 0.95 * best - 1e-6) return s;
  }
  return 1;
}

void test_split_heuristic() {
  long mismatches = 0;
  for (int sms : {108, 132}) {
    for (int ctas = 1; ctas <= 2 * sms; ctas += 1) {
      for (int n_blocks : {1, 2, 3, 7, 16, 64, 129, 1024}) {
        for (int max_splits : {1, 8, 128}) {
          const int got = num_splits_heuristic(ctas, sms, n_blocks, max_splits);
          const int want = ref_num_splits(ctas, sms, n_blocks, max_splits);
          if (got != want && ++mismatches <= 5) {
            CHECK_EQ(got, want, fmt("num_splits_heuristic(ctas %d, sms %d, n_blocks %d, max %d)", ctas, sms,
                                    n_blocks, max_splits));
          }
          if (got < 1 || got > std::max(1, std::min({max_splits, n_blocks, sms}))) {
            CHECK(false, fmt("num_splits_heuristic(%d, %d, %d, %d) = %d out of range", ctas, sms, n_blocks,
                             max_splits, got));
          }
        }
      }
    }
  }
  if (mismatches == 0) ++g_passed;
  // Decode, batch 1, 32 heads, one row block, 64 key blocks on 132 SMs: 4 splits fill 97 % of a wave.
  CHECK_EQ(num_splits_heuristic(32, 132, 64, 128), 4, "decode 32 CTAs, 64 key blocks");
  // Batch 8 x 8 KV heads over 256 key blocks on 132 SMs x 8 slots: 16 splits fill 97 % of the slots
  // (85 % would take 14, 85 % of them).
  CHECK_EQ(num_splits_heuristic(64, 1056, 256, 128), 16, "decode 64 CTAs, 256 key blocks, 1056 slots");
  CHECK_EQ(num_splits_heuristic(132, 132, 64, 128), 1, "a full wave is not split");
  CHECK_EQ(num_splits_heuristic(1, 132, 1, 128), 1, "one key block is not split");
  // The dependent launch: bench_decode's short points (8 KV heads, hdim 128, bf16) take it, the
  // long ones do not; 64 MiB of keys and values is the edge.
  CHECK(split_launch_dependent(1, 8, 1024, 128, 2), "batch 1 over 1k keys: dependent");
  CHECK(split_launch_dependent(8, 8, 1024, 128, 2), "batch 8 over 1k keys: dependent");
  CHECK(split_launch_dependent(1, 8, 8192, 128, 2), "batch 1 over 8k keys: dependent");
  CHECK(split_launch_dependent(1, 8, 16384, 128, 2), "64 MiB: dependent");
  CHECK(!split_launch_dependent(1, 8, 16385, 128, 2), "just past 64 MiB: ordinary");
  CHECK(!split_launch_dependent(8, 8, 8192, 128, 2), "batch 8 over 8k keys: ordinary");
  CHECK(!split_launch_dependent(1, 8, 131072, 128, 2), "batch 1 over 128k keys: ordinary");
  CHECK(!split_launch_dependent(64, 8, 131072, 256, 4), "no int overflow at 64 x 128k x 256 fp32");
}

void test_split_range() {
  long bad = 0;
  for (int n_min : {0, 3}) {
    for (int n_max = n_min; n_max <= n_min + 40; ++n_max) {
      for (int masked = 0; masked <= n_max - n_min; masked += 3) {
        for (int unmasked_min = n_min; unmasked_min <= n_max - masked; unmasked_min += 4) {
          const NBlockRange full{n_min, n_max, masked, unmasked_min};
          for (int splits = 1; splits <= 12; ++splits) {
            int next = n_min;
            for (int i = 0; i < splits; ++i) {
              const NBlockRange r = split_n_block_range(full, splits, i);
              const int len = std::max(r.n_block_max - r.n_block_min, 0);
              // Consecutive, in order, inside the full range, every block keeping its kind (masked or not).
              bool ok = (len == 0 || r.n_block_min == next) && r.n_block_max <= n_max && r.n_masked_steps >= 0 &&
                        r.n_masked_steps <= len;
              for (int nb = r.n_block_min; nb < r.n_block_max; ++nb) ok = ok && r.is_masked(nb) == full.is_masked(nb);
              if (!ok && ++bad <= 5) {
                CHECK(ok, fmt("split_n_block_range({%d, %d, %d, %d}, %d, %d) = {%d, %d, %d, %d}", n_min, n_max, masked,
                              unmasked_min, splits, i, r.n_block_min, r.n_block_max, r.n_masked_steps,
                              r.n_block_unmasked_min));
              }
              if (len > 0) next = r.n_block_max;
            }
            if (next != n_max && ++bad <= 5) {
              CHECK(false, fmt("splits of {%d, %d, %d, %d} into %d cover up to %d (want %d)", n_min, n_max, masked,
                               unmasked_min, splits, next, n_max));
            }
          }
        }
      }
    }
  }
  if (bad == 0) ++g_passed;
}

// Combines as the combine kernel does (warps_per_row warps taking alternate chunks of kChunk splits,
// then merged in order) and with a double-precision log-sum-exp; returns the max error.
template <int kChunk>
double combine_error(std::vector<float> const& lses, std::vector<float> const& outs, int warps_per_row) {
  const int n = int(lses.size());
  std::vector<SplitCombine> folds(warps_per_row);
  std::vector<double> accs(warps_per_row, 0.0);
  for (int part = 0; part < warps_per_row; ++part) {
    for (int s0 = part * kChunk; s0 < n; s0 += warps_per_row * kChunk) {
      float chunk[kChunk];
      for (int i = 0; i < kChunk; ++i) chunk[i] = s0 + i < n ? lses[s0 + i] : -INFINITY;
      accs[part] *= folds[part].add_chunk(chunk);
      for (int i = 0; i < kChunk && s0 + i < n; ++i) accs[part] += double(folds[part].weight(chunk[i])) * outs[s0 + i];
    }
  }
  SplitCombine c = folds[0];
  double acc = accs[0];
  for (int w = 1; w < warps_per_row; ++w) {
    const SplitCombine::Scales scales = c.merge(folds[w]);
    acc = acc * scales.self + accs[w] * scales.other;
  }
  const double got_o = acc * c.out_scale();
  double m = -INFINITY;
  for (float l : lses) m = std::max(m, double(l));
  double sum = 0.0;
  for (float l : lses) sum += l == -INFINITY ? 0.0 : std::exp(double(l) - m);
  const double want_lse = sum > 0 ? m + std::log(sum) : INFINITY;
  double want_o = 0.0;
  for (int i = 0; i < n; ++i) want_o += lses[i] == -INFINITY ? 0.0 : std::exp(double(lses[i]) - want_lse) * outs[i];
  if (std::isinf(want_lse)) return c.lse() == INFINITY && got_o == 0.0 ? 0.0 : INFINITY;
  return std::max(std::fabs(double(c.lse()) - want_lse) / std::max(1.0, std::fabs(want_lse)),
                  std::fabs(got_o - want_o));
}

void test_split_combine() {
  unsigned state = 12345u;
  auto uniform = [&]() {
    state = state * 1664525u + 1013904223u;
    return (state >> 8) / float(1u << 24);
  };
  double worst = 0.0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + trial % 131;
    const float scale = trial % 3 == 0 ? 1e4f : 20.f;  // large LSEs must not overflow
    const float empty = trial % 5 == 0 ? 0.9f : 0.3f;  // chunks with no key at all, too
    std::vector<float> lses(n), outs(n);
    for (int i = 0; i < n; ++i) {
      lses[i] = uniform() < empty ? -INFINITY : (uniform() - 0.5f) * scale;
      outs[i] = uniform() * 2.f - 1.f;
    }
    for (int warps : {1, 2, 4, 8}) {
      worst = std::max(worst, combine_error<16>(lses, outs, warps));
      worst = std::max(worst, combine_error<8>(lses, outs, warps));
    }
  }
  CHECK(worst < 1e-5, fmt("SplitCombine (chunks, merged warps) vs double log-sum-exp: max error %.3g", worst));
  // Every split empty: LSE +inf and O 0, whichever warps fold them.
  for (int warps : {1, 2, 4}) {
    CHECK(combine_error<16>(std::vector<float>(40, -INFINITY), std::vector<float>(40, 1.f), warps) == 0.0,
          "all splits empty: LSE is +inf and O is 0");
  }
  // One split: its own LSE and weight 1.
  SplitCombine one;
  const float single[2] = {3.5f, -INFINITY};
  one.add_chunk(single);
  CHECK(one.lse() == 3.5f && one.weight(3.5f) == 1.f && one.out_scale() == 1.f, "one split passes through");
  // Two or four splits are the warps of one CTA; other counts are one-warp CTAs.
  CHECK(split_warps(2) == 2 && split_warps(4) == 4, "2 and 4 splits: the warps of one CTA");
  CHECK(split_warps(0) == 1 && split_warps(1) == 1 && split_warps(3) == 1 && split_warps(8) == 1 &&
            split_warps(128) == 1, "other split counts: one-warp CTAs");
  CHECK(split_ctas(2) == 1 && split_ctas(4) == 1 && split_ctas(3) == 3 && split_ctas(128) == 128,
        "CTA splits: none past the warps of one CTA");
  // Warps per row: one while a chunk holds every split, then doubling up to the CTA's warps.
  CHECK(combine_warps_per_row(1, 16, 8) == 1 && combine_warps_per_row(16, 16, 8) == 1, "<= one chunk: one warp");
  CHECK(combine_warps_per_row(17, 16, 8) == 2 && combine_warps_per_row(33, 16, 8) == 4, "more chunks: more warps");
  CHECK(combine_warps_per_row(128, 16, 8) == 8 && combine_warps_per_row(128, 8, 8) == 8, "at most the CTA's warps");
}

// ----------------------------------------------------------------------------------------------
// block_info: sequence lengths and element offsets, fixed-length and varlen.

// The persistent Hopper forward's tile order: every tile exactly once, sections that fit in L2,
// causal row blocks within a section heaviest first, a GQA group's heads side by side.
void test_ws_tile_order() {
  const int64_t kv_bytes_list[] = {0, 1, int64_t(64) << 10, int64_t(8) << 20, int64_t(40) << 20};
  for (int m_blocks : {1, 3, 8, 17}) {
    for (int batch : {1, 2, 5}) {
      for (int heads : {1, 3, 16}) {
        for (int64_t kv_bytes : kv_bytes_list) {
          for (bool causal : {false, true}) {
            const FwdWsTileOrder order = FwdWsTileOrder::make(m_blocks, batch, heads, kv_bytes, causal);
            const std::string what = fmt("m_blocks %d batch %d heads %d kv %lld causal %d", m_blocks, batch, heads,
                                         (long long)kv_bytes, int(causal));
            CHECK_EQ(order.n_tiles(), m_blocks * batch * heads, what);
            CHECK(order.section >= 1 && order.section <= batch * heads, what);
            CHECK(order.section == 1 || (causal && order.section * kv_bytes <= FwdWsTileOrder::kL2Bytes),
                  what + " non-causal: a pair per section; causal: sections that fit in L2");
            // bottom_up: the forward's causal order; the Hopper backward takes tile<false> with causal
            // sections too (key block 0, the heaviest there, first).
            for (bool bottom_up : {false, true}) {
              if (bottom_up && !causal) continue;
              std::vector<int> seen(m_blocks * batch * heads, 0);
              FwdWsTile prev{};
              bool in_range = true, heaviest_first = true, heads_side_by_side = true;
              for (int t = 0; t < order.n_tiles(); ++t) {
                const FwdWsTile x = bottom_up ? order.tile<true>(t) : order.tile<false>(t);
                const bool ok = x.m_block >= 0 && x.m_block < m_blocks && x.bidb >= 0 && x.bidb < batch && x.bidh >= 0 &&
                                x.bidh < heads;
                in_range = in_range && ok;
                if (!ok) continue;
                ++seen[(x.bidb * heads + x.bidh) * m_blocks + x.m_block];
                const int pair = x.bidb * heads + x.bidh, prev_pair = prev.bidb * heads + prev.bidh;
                if (t > 0 && pair / order.section == prev_pair / order.section) {  // the same section
                  heaviest_first = heaviest_first && (bottom_up ? x.m_block <= prev.m_block : x.m_block >= prev.m_block);
                  heads_side_by_side = heads_side_by_side && (x.m_block != prev.m_block || pair == prev_pair + 1);
                }
                prev = x;
              }
              CHECK(in_range, what);
              CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }), what + " every tile once");
              CHECK(heaviest_first, what + (bottom_up ? " causal: bottom row blocks first" : " row blocks in order"));
              CHECK(heads_side_by_side, what + " a row block's pairs side by side");
            }
          }
        }
      }
    }
  }
}

// A varlen batch of 4 sequences (cu_seqlens of 5 entries): max_seqlen_q / _k, q's and k's rows.
FwdParams varlen_params(const int* cu_q, const int* cu_k, int max_q, int max_k, index_t total_q, index_t total_k) {
  FwdParams p;
  p.batch = 4;
  p.seqlen_q = max_q;
  p.seqlen_k = max_k;
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  p.total_q = total_q;
  p.total_k = total_k;
  return p;
}

// Which launches the Hopper kernels' TMA loads take (fwd_ws_tma_fits, bwd_sm90_tma_fits), and the
// views and Q extents their descriptors are built with: varlen as one batch entry of the packed rows.
void test_tma_fits() {
  alignas(16) static char base[16];  // a 16-byte aligned address, never read
  const int cu_q[] = {0, 5, 12, 12, 40}, cu_k[] = {0, 7, 7, 30, 31};
  FwdParams p = varlen_params(cu_q, cu_k, 28, 23, 45, 36);
  p.heads = 16;
  p.heads_k = 8;
  p.head_dim = 128;
  p.q = {base, 0, 16 * 128, 128};  // (total_q, heads, dim): no batch stride
  p.k = p.v = {base, 0, 8 * 128, 128};
  CHECK(fwd_ws_tma_fits(p), "varlen");
  CHECK_EQ(tma_view_q(p.q, p).batch_stride, 45 * 16 * 128, "varlen Q: the packed rows' extent");
  CHECK_EQ(tma_view_k(p.v, p).batch_stride, 36 * 8 * 128, "varlen V: the packed rows' extent");
  CHECK_EQ(tma_view_k(p.v, p).row_stride, 8 * 128, "varlen V: its row stride kept");
  const TmaShape shape_q = tma_shape_q(p);
  CHECK_EQ(get<0>(shape_q), 45, "varlen Q's rows: total_q");
  CHECK_EQ(get<3>(shape_q), 1, "varlen Q's batch extent");
  FwdParams used = p;
  const int seqused[] = {3, 0, 20, 1};
  used.seqused_k = seqused;
  CHECK(fwd_ws_tma_fits(used), "varlen with seqused_k");
  for (int which = 0; which < 5; ++which) {
    FwdParams no = p;
    const int pad[] = {0, 1, 0, 0};
    if (which == 0) no.total_q = 0;                      // no descriptor for an empty tensor
    if (which == 1) no.total_k = index_t{1} << 31;       // past an int32 coordinate
    if (which == 2) no.leftpad_k = pad;                  // not at a row offset of a batch entry
    if (which == 3) no.kv_batch_idx = pad;
    if (which == 4) no.q.row_stride = 16 * 128 + 4;      // an 8-byte row stride
    CHECK(!fwd_ws_tma_fits(no), fmt("case %d: cp.async", which));
  }
  // Fixed-length batches: the views as they are, seqlen_q rows a batch entry.
  FwdParams fixed;
  fixed.batch = 3;
  fixed.seqlen_q = 100;
  fixed.seqlen_k = 200;
  fixed.head_dim = 64;
  fixed.q = {base, 100 * 4 * 64, 4 * 64, 64};
  fixed.k = fixed.v = {base, 200 * 64, 64, 200 * 64 * 3};  // (batch, heads, seqlen, dim) memory order
  CHECK(fwd_ws_tma_fits(fixed), "fixed length");
  CHECK_EQ(tma_view_q(fixed.q, fixed).batch_stride, 100 * 4 * 64, "fixed length: the batch stride kept");
  CHECK_EQ(get<3>(tma_shape_q(fixed)), 3, "fixed length: the batch extent");
  fixed.block_table = cu_q;
  CHECK(!fwd_ws_tma_fits(fixed), "a paged cache: cp.async");
  // The backward's Q and dO.
  BwdParams b;
  static_cast<FwdParams&>(b) = p;
  b.dout = p.q;
  CHECK(bwd_sm90_tma_fits(b), "backward, varlen");
  b.total_q = 0;
  CHECK(!bwd_sm90_tma_fits(b), "backward, no rows");
}

void test_block_info() {
  constexpr index_t k2to31 = index_t{1} << 31;
  {
    // Fixed length: (batch 4, seqlen_q 1000, heads 16, dim 128) q, (batch 4, seqlen_k 3000, heads_k 2,
    // dim 128) k; strides in elements.
    FwdParams p;
    p.batch = 4;
    p.heads = 16;
    p.heads_k = 2;
    p.seqlen_q = 1000;
    p.seqlen_k = 3000;
    p.q = {nullptr, 1000L * 16 * 128, 16 * 128, 128};
    p.k = {nullptr, 3000L * 2 * 128, 2 * 128, 128};
    p.lse_batch_stride = 16L * 1000;
    p.lse_head_stride = 1000;
    const BlockInfo bi(p, 3);
    CHECK_EQ(bi.seqlen_q, 1000, "fixed: seqlen_q");
    CHECK_EQ(bi.seqlen_k, 3000, "fixed: seqlen_k");
    CHECK(!bi.is_varlen, "fixed: not varlen");
    CHECK_EQ(bi.q_offset(p.q, 3, 5), 3L * 2048000 + 5 * 128, "fixed: q_offset(b 3, h 5)");
    CHECK_EQ(bi.k_offset(p.k, 1), 3L * 768000 + 1 * 128, "fixed: k_offset(b 3, h 1)");
    CHECK_EQ(bi.lse_offset(p, 3, 5), 3L * 16000 + 5 * 1000, "fixed: lse_offset(b 3, h 5)");
    const BlockInfo b0(p, 0);
    CHECK_EQ(b0.q_offset(p.q, 0, 0), 0, "fixed: q_offset(b 0, h 0)");
    CHECK_EQ(b0.lse_offset(p, 0, 15), 15 * 1000, "fixed: lse_offset(b 0, h 15)");
  }
  {
    // Fixed length past 2^31 elements: batch_stride 2^30, batch 3 -> 3 * 2^30 + h * head_stride.
    FwdParams p;
    p.seqlen_q = 1 << 16;
    p.seqlen_k = 1 << 16;
    p.q = {nullptr, index_t{1} << 30, 1 << 14, 128};
    p.k = p.q;
    p.lse_batch_stride = index_t{1} << 30;  // absurd, but exercises 64-bit math
    p.lse_head_stride = 1 << 16;
    const BlockInfo bi(p, 3);
    CHECK_EQ(bi.q_offset(p.q, 3, 127), 3221225472LL + 127 * 128, "fixed 64-bit: q_offset(b 3, h 127)");
    CHECK(bi.q_offset(p.q, 3, 127) > k2to31, "fixed 64-bit: q_offset exceeds 2^31");
    CHECK_EQ(bi.k_offset(p.k, 0), 3221225472LL, "fixed 64-bit: k_offset(b 3, h 0)");
    CHECK_EQ(bi.lse_offset(p, 3, 1), 3221225472LL + 65536, "fixed 64-bit: lse_offset(b 3, h 1)");
  }
  {
    // Varlen: q (total_q, heads 8, dim 64), k (total_k, heads_k 4, dim 64); lse (heads, total_q).
    const int cu_q[] = {0, 5, 12, 12, 40};
    const int cu_k[] = {0, 7, 7, 30, 31};
    FwdParams p = varlen_params(cu_q, cu_k, 28, 23, 40, 31);
    p.heads = 8;
    p.heads_k = 4;
    p.q = {nullptr, 0, 8 * 64, 64};
    p.k = {nullptr, 0, 4 * 64, 64};
    p.lse_head_stride = 40;  // total_q
    const int want_sq[] = {5, 7, 0, 28};
    const int want_sk[] = {7, 0, 23, 1};
    for (int b = 0; b < 4; ++b) {
      const BlockInfo bi(p, b);
      CHECK(bi.is_varlen, fmt("varlen b %d: is_varlen", b));
      CHECK_EQ(bi.seqlen_q, want_sq[b], fmt("varlen b %d: seqlen_q", b));
      CHECK_EQ(bi.seqlen_k, want_sk[b], fmt("varlen b %d: seqlen_k", b));
      CHECK_EQ(bi.q_row_start, cu_q[b], fmt("varlen b %d: q_row_start", b));
      CHECK_EQ(bi.k_row_start, cu_k[b], fmt("varlen b %d: k_row_start", b));
    }
    const BlockInfo b1(p, 1);
    CHECK_EQ(b1.q_offset(p.q, 1, 3), 5 * 512 + 3 * 64, "varlen: q_offset(b 1, h 3)");
    // max_seqlen below a sequence's length (a caller error the kernels cannot check): cut to it.
    FwdParams short_max = p;
    short_max.seqlen_q = 20;
    short_max.seqlen_k = 10;
    CHECK_EQ(BlockInfo(short_max, 3).seqlen_q, 20, "varlen: seqlen_q 28 cut to max_seqlen_q 20");
    CHECK_EQ(BlockInfo(short_max, 2).seqlen_k, 10, "varlen: seqlen_k 23 cut to max_seqlen_k 10");
    CHECK_EQ(BlockInfo(short_max, 0).seqlen_q, 5, "varlen: seqlen_q 5 under the max is kept");
    // seqused_k: a prefix of each sequence's keys, never more than the sequence has.
    const int used[] = {3, 9, 0, 1};
    FwdParams with_used = p;
    with_used.seqused_k = used;
    CHECK_EQ(BlockInfo(with_used, 0).seqlen_k, 3, "varlen seqused_k: 3 of 7 keys");
    CHECK_EQ(BlockInfo(with_used, 1).seqlen_k, 0, "varlen seqused_k: 9 of 0 keys is cut to 0");
    CHECK_EQ(BlockInfo(with_used, 2).seqlen_k, 0, "varlen seqused_k: 0 of 23 keys");
    CHECK_EQ(BlockInfo(with_used, 3).k_row_start, 30, "varlen seqused_k: the keys still start at cu_seqlens_k");
    CHECK_EQ(b1.k_offset(p.k, 2), 7 * 256 + 2 * 64, "varlen: k_offset(b 1, h 2)");
    CHECK_EQ(b1.lse_offset(p, 1, 3), 5 + 3 * 40, "varlen: lse_offset(b 1, h 3)");
    const BlockInfo b3(p, 3);
    CHECK_EQ(b3.q_offset(p.q, 3, 7), 12 * 512 + 7 * 64, "varlen: q_offset(b 3, h 7)");
    CHECK_EQ(b3.k_offset(p.k, 0), 30 * 256, "varlen: k_offset(b 3, h 0)");
    CHECK_EQ(b3.lse_offset(p, 3, 7), 12 + 7 * 40, "varlen: lse_offset(b 3, h 7)");
  }
  {
    // Varlen past 2^31 elements: the second sequence starts at row 2^30 (an int), row stride
    // 16 heads * 128 = 2048 -> offset 2^41 + ...; lse (heads 16, total_q 2^30 + 100).
    const int cu_q[] = {0, 1 << 30, (1 << 30) + 100};
    const int cu_k[] = {0, 1 << 29, (1 << 29) + 50};
    FwdParams p;
    p.batch = 2;
    p.heads = 16;
    p.heads_k = 16;
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = cu_k;
    p.seqlen_q = 1 << 30;  // max_seqlen_q: the first sequence's 2^30 rows
    p.seqlen_k = 1 << 29;
    p.total_q = (index_t{1} << 30) + 100;
    p.total_k = (index_t{1} << 29) + 50;
    p.q = {nullptr, 0, 16 * 128, 128};
    p.k = {nullptr, 0, 16 * 128, 128};
    p.lse_head_stride = (index_t{1} << 30) + 100;
    const BlockInfo bi(p, 1);
    CHECK_EQ(bi.seqlen_q, 100, "varlen 64-bit: seqlen_q");
    CHECK_EQ(bi.seqlen_k, 50, "varlen 64-bit: seqlen_k");
    CHECK_EQ(bi.q_offset(p.q, 1, 15), 2199023255552LL + 15 * 128, "varlen 64-bit: q_offset(b 1, h 15)");
    CHECK_EQ(bi.k_offset(p.k, 15), 1099511627776LL + 15 * 128, "varlen 64-bit: k_offset(b 1, h 15)");
    CHECK_EQ(bi.lse_offset(p, 1, 15), 1073741824LL + 15 * 1073741924LL, "varlen 64-bit: lse_offset(b 1, h 15)");
    CHECK(bi.lse_offset(p, 1, 15) > k2to31, "varlen 64-bit: lse_offset exceeds 2^31");
  }
  {
    // cu_seqlens past the tensors or decreasing (caller errors the host cannot see on the device):
    // every sequence's rows are cut to q's 40 and k's 31, a decreasing one left empty.
    const int cu_q[] = {-3, 5, 50, 30, 41};
    const int cu_k[] = {0, 100, 20, 20, 7};
    const FwdParams p = varlen_params(cu_q, cu_k, 100, 64, 40, 31);
    const int want_start_q[] = {0, 5, 40, 30}, want_sq[] = {5, 35, 0, 10};
    const int want_start_k[] = {0, 31, 20, 20}, want_sk[] = {31, 0, 0, 0};
    for (int b = 0; b < 4; ++b) {
      const BlockInfo bi(p, b);
      CHECK_EQ(bi.q_row_start, want_start_q[b], fmt("bad cu_seqlens b %d: q_row_start", b));
      CHECK_EQ(bi.seqlen_q, want_sq[b], fmt("bad cu_seqlens b %d: seqlen_q", b));
      CHECK_EQ(bi.k_row_start, want_start_k[b], fmt("bad cu_seqlens b %d: k_row_start", b));
      CHECK_EQ(bi.seqlen_k, want_sk[b], fmt("bad cu_seqlens b %d: seqlen_k", b));
      CHECK(bi.q_row_start + bi.seqlen_q <= p.total_q && bi.k_row_start + bi.seqlen_k <= p.total_k,
            fmt("bad cu_seqlens b %d: rows past the tensors", b));
    }
  }
  {
    // KV cache: capacity 100 rows, cache batch 3 (k_batch from kv_batch_idx), per-sequence used
    // lengths and left padding; bad values are cut, a bad batch index leaves the sequence no keys.
    const int seqused[] = {40, 100, 250, -5, 30};
    const int leftpad[] = {10, 0, 20, 0, 50};
    const int batch_idx[] = {2, 0, 1, 3, -1};
    FwdParams p;
    p.batch = 5;
    p.seqlen_q = 1;
    p.seqlen_k = 100;
    p.kv_batch = 3;
    p.k = {nullptr, 100L * 2 * 64, 2 * 64, 64};
    p.seqused_k = seqused;
    p.leftpad_k = leftpad;
    p.kv_batch_idx = batch_idx;
    const BlockInfo b0(p, 0);
    CHECK_EQ(b0.seqlen_k, 30, "cache: seqused 40 - leftpad 10");
    CHECK_EQ(b0.k_offset(p.k, 1), 2L * 12800 + 10 * 128 + 64, "cache: k_offset(b 0 -> cache 2, row 10, h 1)");
    CHECK_EQ(BlockInfo(p, 1).seqlen_k, 100, "cache: the whole capacity");
    CHECK_EQ(BlockInfo(p, 2).seqlen_k, 80, "cache: seqused 250 cut to capacity 100 - leftpad 20");
    CHECK_EQ(BlockInfo(p, 3).seqlen_k, 0, "cache: index 3 outside the 3 cache entries: no keys");
    CHECK_EQ(BlockInfo(p, 4).seqlen_k, 0, "cache: index -1: no keys");
    CHECK_EQ(BlockInfo(p, 4).k_offset(p.k, 0), 50 * 128, "cache: bad index reads entry 0");
    p.kv_batch_idx = nullptr;
    CHECK_EQ(BlockInfo(p, 3).seqlen_k, 0, "cache: negative seqused gives no keys");
    CHECK_EQ(BlockInfo(p, 4).k_batch, 4, "cache: without kv_batch_idx, k_batch is the batch");
    p.block_table = batch_idx;
    CHECK_EQ(BlockInfo(p, 4).k_batch, 0, "paged: pages are found by the kernel, k_batch 0");
  }
  {
    // Which instantiation a call needs: causal (with or without a left window) and full windows
    // stay in the plain kernels; a window on a non-causal kernel takes the score-mod ones (the host
    // sends windows (left, 0) to the causal kernels first).
    FwdParams p;
    CHECK(!p.has_score_mods(), "defaults: plain kernel");
    p.is_causal = true;
    p.window = {-1, 0};
    CHECK(!p.has_score_mods(), "causal: plain kernel");
    p.window = {128, 0};
    CHECK(!p.has_score_mods(), "causal + left window: plain kernel");
    p.is_causal = false;
    p.window = {-1, 0};
    CHECK(p.has_score_mods(), "window (-1, 0) on the non-causal kernel: score-mod kernel");
    p.window = {128, 16};
    CHECK(p.has_score_mods(), "window (128, 16): score-mod kernel");
    p.window = {};
    p.softcap = 0.1f;
    CHECK(p.has_score_mods(), "softcap: score-mod kernel");
    p.softcap = 0.f;
    const float slopes[] = {0.5f};
    p.alibi_slopes = slopes;
    CHECK(p.has_score_mods(), "ALiBi: score-mod kernel");
  }
  {
    // Paged rows: 2 sequences of 3 pages of 16 rows (table row stride 3), 7 pages in the cache.
    const int table[] = {4, 0, 6, 1, 9, -2};
    FwdParams p;
    p.block_table = table;
    p.block_table_batch_stride = 3;
    p.page_size = 16;
    p.kv_batch = 7;
    const TensorView kv{nullptr, 16L * 2 * 64, 2 * 64, 64};
    CHECK_EQ(paged_row_offset(p, kv, 0, 0), 4L * 2048, "paged: seq 0 row 0 -> page 4 row 0");
    CHECK_EQ(paged_row_offset(p, kv, 0, 17), 0L * 2048 + 1 * 128, "paged: seq 0 row 17 -> page 0 row 1");
    CHECK_EQ(paged_row_offset(p, kv, 0, 47), 6L * 2048 + 15 * 128, "paged: seq 0 row 47 -> page 6 row 15");
    CHECK_EQ(paged_row_offset(p, kv, 1, 5), 1L * 2048 + 5 * 128, "paged: seq 1 row 5 -> page 1 row 5");
    CHECK_EQ(paged_row_offset(p, kv, 1, 16), -1, "paged: page 9 is outside the 7 pages");
    CHECK_EQ(paged_row_offset(p, kv, 1, 40), -1, "paged: a negative page");
    // Rotary: which vector of a row owns (reads and writes) each rotated pair.
    CHECK(rotary_vector_is_owner(8, 64, true), "rotary: interleaved vectors own their pairs");
    CHECK(rotary_vector_is_owner(24, 64, false), "rotary: first half owns (24, 56)");
    CHECK(!rotary_vector_is_owner(32, 64, false), "rotary: second half is written by the first");
    CHECK(rotary_vector_is_owner(64, 64, false), "rotary: columns past rotary_dim are plain copies");
  }
}

// ----------------------------------------------------------------------------------------------
// row_written (varlen_rows.h): the rows that varlen_rows.cu leaves alone are exactly those some
// sequence's kernels write, by an independent count: sequence b's rows cu[b] .. cu[b] + min(length,
// max_seqlen) (keys: also at most seqused_k[b]). With cu_seqlens that do not ascend, a row it calls
// written still is.
void test_varlen_rows() {
  auto covered = [](const int* cu, int batch, int max_len, const int* used, int total, int row) {
    for (int b = 0; b < batch; ++b) {
      const int start = std::min(std::max(cu[b], 0), total);
      int len = std::min(std::max(std::min(std::max(cu[b + 1], 0), total) - start, 0), max_len);
      if (used != nullptr) len = std::max(std::min(len, used[b]), 0);
      if (row >= start && row < start + len) return true;
    }
    return false;
  };
  auto check_all = [&](FwdParams const& p, const int* used, bool ascending, const char* name) {
    for (int keys = 0; keys < 2; ++keys) {
      const int* cu = keys ? p.cu_seqlens_k : p.cu_seqlens_q;
      const int total = int(keys ? p.total_k : p.total_q);
      const int max_len = keys ? p.seqlen_k : p.seqlen_q;
      for (int row = 0; row < total; ++row) {
        const bool want = covered(cu, p.batch, max_len, keys ? used : nullptr, total, row);
        const bool got = row_written(p, row, keys == 1);
        if (ascending) {
          CHECK_EQ(got, want, fmt("%s: %s row %d", name, keys ? "key" : "query", row));
        } else {
          CHECK(!got || want, fmt("%s: %s row %d called written", name, keys ? "key" : "query", row));
        }
      }
    }
  };
  // Empty sequences on either side, rows past cu_seqlens[-1] (total 45 / 36), a sequence (28 rows)
  // longer than a short max_seqlen_q.
  const int cu_q[] = {0, 5, 12, 12, 40};
  const int cu_k[] = {0, 7, 7, 30, 31};
  FwdParams p = varlen_params(cu_q, cu_k, 28, 23, 45, 36);
  check_all(p, nullptr, true, "varlen");
  FwdParams cut = p;
  cut.seqlen_q = 20;
  cut.seqlen_k = 10;
  check_all(cut, nullptr, true, "varlen, max_seqlen cut");
  const int used[] = {3, 9, 0, 1};
  FwdParams with_used = p;
  with_used.seqused_k = used;
  check_all(with_used, used, true, "varlen, seqused_k");
  // A first sequence that starts past row 0, and a batch of one.
  const int late_q[] = {4, 9}, late_k[] = {2, 3};
  FwdParams late = varlen_params(late_q, late_k, 5, 1, 12, 6);
  late.batch = 1;
  check_all(late, nullptr, true, "varlen, rows before cu_seqlens[0]");
  // cu_seqlens that do not ascend (a caller error).
  const int down_q[] = {0, 30, 10, 20, 40};
  const int down_k[] = {0, 20, 5, 25, 31};
  check_all(varlen_params(down_q, down_k, 40, 31, 45, 36), nullptr, false, "varlen, descending cu_seqlens");
}

// Dropout: Philox against its published answer, the keep threshold and kept fraction, and the
// property the kernels rely on: in every tile's S fragment, each thread's (m, 4 g .. 4 g + 3)
// entries are one 16 x 32 chunk of one lane, with byte 4 * nn + v at (v, m, 4 g + nn).

void test_dropout_rng() {
  // Random123's known-answer vector for Philox-4x32-10 with a zero counter and key.
  const Philox4 zero = philox<10>({0, 0, 0, 0}, {0, 0});
  CHECK(zero.x == 0x6627e8d5u && zero.y == 0xe169c58du && zero.z == 0xbc57ac4cu && zero.w == 0x9b00dbd8u,
        "philox4x32-10 of zeros is Random123's 6627e8d5 e169c58d bc57ac4c 9b00dbd8");
  CHECK_EQ(dropout_threshold(0.f), 256u, "p = 0 keeps every byte");
  CHECK_EQ(dropout_threshold(0.1f), 230u, "p = 0.1: round(0.9 * 256)");
  CHECK_EQ(dropout_threshold(0.5f), 128u, "p = 0.5");
  CHECK_EQ(dropout_threshold(0.9999f), 0u, "p near 1 drops every byte");
  for (float p : {0.1f, 0.3f, 0.5f, 0.9f}) {
    const DropoutRng rng(0x1234567887654321ull, 8, dropout_threshold(p));
    long kept = 0, total = 0;
    for (uint32_t bh = 0; bh < 4; ++bh) {
      for (int i = 0; i < 200; ++i) {
        for (int j = 0; j < 300; ++j, ++total) kept += rng.keep(bh, i, j);
      }
    }
    const double fraction = double(kept) / double(total);
    CHECK(std::fabs(fraction - (1.0 - p)) < 0.01, "kept fraction " + std::to_string(fraction) + " for p " +
                                                       std::to_string(p));
  }
  // Another offset, head or seed gives another mask.
  const DropoutRng a(7, 0, 128), b(7, 4, 128), c(8, 0, 128);
  long same_offset = 0, same_head = 0, same_seed = 0, n = 0;
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < 64; ++j, ++n) {
      same_offset += a.keep(0, i, j) == b.keep(0, i, j);
      same_head += a.keep(0, i, j) == a.keep(1, i, j);
      same_seed += a.keep(0, i, j) == c.keep(0, i, j);
    }
  }
  for (long same : {same_offset, same_head, same_seed}) {
    CHECK(same > n / 2 - n / 10 && same < n / 2 + n / 10, "independent masks agree on about half the entries");
  }
}

// Every thread's S fragment of one tiled MMA over a (kM, kN) tile, as dropout.h expects.
template <class TiledMma, int kM, int kN>
void check_dropout_fragments(const char* what) {
  TiledMma mma;
  std::vector<int> owners(kM * kN, 0);
  long bad = 0;
  for (int tid = 0; tid < int(size(mma)); ++tid) {
    Tensor tScS = mma.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<Int<kM>, Int<kN>>{}));
    for (int m = 0; m < int(size<1>(tScS)); ++m) {
      for (int g = 0; g < int(size<2>(tScS)) / 4; ++g) {
        const int r0 = get<0>(tScS(0, m, 4 * g)), c0 = get<1>(tScS(0, m, 4 * g));
        for (int nn = 0; nn < 4; ++nn) {
          for (int v = 0; v < 4; ++v) {
            const int r = get<0>(tScS(v, m, 4 * g + nn)), c = get<1>(tScS(v, m, 4 * g + nn));
            owners[r * kN + c] += 1;
            const bool same_chunk = r / 16 == r0 / 16 && c / 32 == c0 / 32;
            const bool same_lane = (r % 8) * 4 + (c % 8) / 2 == (r0 % 8) * 4 + (c0 % 8) / 2;
            const bool byte_ok = (c % 32) / 8 == nn && ((r % 16) / 8) * 2 + c % 2 == v;
            bad += !(same_chunk && same_lane && byte_ok);
          }
        }
      }
    }
  }
  CHECK_EQ(bad, 0L, std::string(what) + ": entries outside their lane's 16 x 32 chunk or byte");
  CHECK(std::all_of(owners.begin(), owners.end(), [](int o) { return o == 1; }),
        std::string(what) + ": every entry of the tile is in exactly one fragment");
}

// The same for a warpgroup MMA's accumulator ((2, 2, N / 8), MMA_M, MMA_N), seen as m16n8 blocks
// (acc_layout_mma_blocks) as the Hopper kernels hand it to dropout.h.
template <class TiledMma, int kM, int kN>
void check_dropout_fragments_sm90(const char* what) {
  TiledMma mma;
  std::vector<int> owners(kM * kN, 0);
  long bad = 0;
  for (int tid = 0; tid < int(size(mma)); ++tid) {
    Tensor tScS = mma.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<Int<kM>, Int<kN>>{}));
    Tensor blocks = make_tensor(tScS.data(), acc_layout_mma_blocks(tScS.layout()));  // ((2, 2), MMA_M, N / 8)
    for (int m = 0; m < int(size<1>(blocks)); ++m) {
      for (int g = 0; g < int(size<2>(blocks)) / 4; ++g) {
        const int r0 = get<0>(blocks(0, m, 4 * g)), c0 = get<1>(blocks(0, m, 4 * g));
        bad += (r0 % 8) * 4 + (c0 % 8) / 2 != tid % 32;  // the chunk's words are this lane's
        for (int nn = 0; nn < 4; ++nn) {
          for (int v = 0; v < 4; ++v) {
            const int r = get<0>(blocks(v, m, 4 * g + nn)), c = get<1>(blocks(v, m, 4 * g + nn));
            owners[r * kN + c] += 1;
            const bool same_chunk = r / 16 == r0 / 16 && c / 32 == c0 / 32;
            const bool byte_ok = (c % 32) / 8 == nn && ((r % 16) / 8) * 2 + c % 2 == v;
            bad += !(same_chunk && byte_ok);
          }
        }
      }
    }
  }
  CHECK_EQ(bad, 0L, std::string(what) + ": entries outside their lane's 16 x 32 chunk or byte");
  CHECK(std::all_of(owners.begin(), owners.end(), [](int o) { return o == 1; }),
        std::string(what) + ": every entry of the tile is in exactly one fragment");
}

template <int kHeadDim>
void check_dropout_fragments_hdim() {
  using Fwd = FwdKernelTraits<kHeadDim, false, cutlass::bfloat16_t, false, Variant::kDropout>;  // the dropout kernels' tiles
  using FwdCausal = FwdKernelTraits<kHeadDim, true, cutlass::bfloat16_t, false, Variant::kDropout>;
  using Bwd = BwdKernelTraits<kHeadDim, cutlass::bfloat16_t>;
  const std::string d = std::to_string(kHeadDim);
  check_dropout_fragments<typename Fwd::TiledMma, Fwd::kBlockM, Fwd::kBlockN>(("fwd hdim " + d).c_str());
  check_dropout_fragments<typename FwdCausal::TiledMma, FwdCausal::kBlockM, FwdCausal::kBlockN>(
      ("fwd causal hdim " + d).c_str());
  check_dropout_fragments<typename Bwd::TiledMmaSdP, Bwd::kBlockM, Bwd::kBlockN>(("bwd S / dP hdim " + d).c_str());
}

void test_dropout_layout() {
  // The Hopper backward's dropout variant: S = Q K^T with queries as rows (bwd_kernel_sm90.h).
  using Sm90Bwd64 = BwdKernelTraitsSm90<64, cutlass::bfloat16_t, bwd_sm90_block_m(64, Variant::kDropout)>;
  using Sm90Bwd128 = BwdKernelTraitsSm90<128, cutlass::half_t, bwd_sm90_block_m(128, Variant::kDropout)>;
  check_dropout_fragments_sm90<Sm90Bwd64::TiledMmaSdPRows, Sm90Bwd64::kBlockM, Sm90Bwd64::kBlockN>("sm90 bwd S hdim 64");
  check_dropout_fragments_sm90<Sm90Bwd128::TiledMmaSdPRows, Sm90Bwd128::kBlockM, Sm90Bwd128::kBlockN>(
      "sm90 bwd S hdim 128");
  using Sm90Bwd256 = BwdKernelTraitsSm90<256, cutlass::bfloat16_t, bwd_sm90_block_m(256, Variant::kDropout)>;
  check_dropout_fragments_sm90<Sm90Bwd256::TiledMmaSdPRows, Sm90Bwd256::kBlockM, Sm90Bwd256::kBlockN>(
      "sm90 bwd S hdim 256 (32 keys a warpgroup)");
  check_dropout_fragments_hdim<32>();
  check_dropout_fragments_hdim<64>();
  check_dropout_fragments_hdim<96>();
  check_dropout_fragments_hdim<128>();
  check_dropout_fragments_hdim<192>();
  check_dropout_fragments_hdim<256>();
}

// Calls fn(tSrS, tScS) for every thread of a TiledMma: its fragment of a (kM, kN) score tile with
// every score set to fill, and the scores' (row, col) in the tile.
template <class TiledMma, int kM, int kN, class Fn>
void for_each_thread_fragment(float fill, Fn&& fn) {
  TiledMma mma;
  for (int tid = 0; tid < int(size(mma)); ++tid) {
    auto thr = mma.get_thread_slice(tid);
    Tensor tScS = thr.partition_C(make_identity_tensor(Shape<Int<kM>, Int<kN>>{}));
    Tensor tSrS = partition_fragment_C(mma, Shape<Int<kM>, Int<kN>>{});
    for (int i = 0; i < int(size(tSrS)); ++i) tSrS(i) = fill;
    fn(tSrS, tScS);
  }
}

// FwdMask::apply, which works row by row, hides exactly the scores key_visible rejects, for every
// thread's fragment of the forward and the backward S tiles.
template <class TiledMma, int kM, int kN>
long count_mask_apply_errors() {
  long bad = 0;
  const int shapes[][2] = {{128, 128}, {100, 300}, {300, 100}, {1, 700}, {513, 513}};
  const int origins[][2] = {{0, 0}, {128, 0}, {0, 128}, {256, 192}, {384, 512}};
  for (Window w : kWindows) {
    for (auto const& sqk : shapes) {
      const FwdMask mask{sqk[0], sqk[1], w};
      for (auto const& rc : origins) {
        for_each_thread_fragment<TiledMma, kM, kN>(1.f, [&](auto& tSrS, auto const& tScS) {
          mask.apply(tSrS, tScS, rc[0], rc[1]);
          for (int i = 0; i < int(size(tSrS)); ++i) {
            const bool visible = mask.key_visible(rc[0] + get<0>(tScS(i)), rc[1] + get<1>(tScS(i)));
            bad += visible != (tSrS(i) == 1.f);
          }
        });
      }
    }
  }
  return bad;
}

void test_mask_apply() {
  using Fwd = FwdKernelTraits<64, true, cutlass::bfloat16_t>;
  using Bwd = BwdKernelTraits<128, cutlass::bfloat16_t>;
  const long fwd_bad = count_mask_apply_errors<typename Fwd::TiledMma, Fwd::kBlockM, Fwd::kBlockN>();
  const long bwd_bad = count_mask_apply_errors<typename Bwd::TiledMmaSdP, Bwd::kBlockM, Bwd::kBlockN>();
  CHECK_EQ(fwd_bad, 0L, "forward tile (hdim 64): apply matches key_visible");
  CHECK_EQ(bwd_bad, 0L, "backward S tile (hdim 128): apply matches key_visible");
}

// apply_alibi and fill_alibi (the kernels' per-row / per-column walks) against alibi_bias (the
// definition) on every thread's fragment of the forward and the backward S tiles, both bias forms,
// in tiles across the diagonal and on either side of it. Returns the largest error in units of its
// bound, 2^-22 * (|value| + slope * kN), which holds the roundings: of the bias (in the symmetric
// form, also of a row's first distance times the slope, that distance at most |d| + kN:
// for_each_alibi_bias) and of apply_alibi's sum.
template <class TiledMma, int kM, int kN>
double max_alibi_apply_error() {
  double worst = 0;
  const int shapes[][2] = {{128, 128}, {100, 300}, {300, 100}, {1, 700}, {16384, 16384}};
  const int origins[][2] = {{0, 0}, {128, 64}, {64, 256}, {16256, 16320}, {8192, 128}, {128, 8192}};
  const float slope = 0.0625f / 0.088f;  // slope / softmax_scale
  auto bound = [&](double value) { return std::ldexp(std::abs(value) + double(slope) * kN, -22); };
  for (bool causal_form : {false, true}) {
    for (auto const& sqk : shapes) {
      for (auto const& rc : origins) {
        // The causal form from column 0 (flash-attn's) and from the tile's first diagonal.
        const int col_ref = causal_form && rc[1] > 0 ? rc[0] + sqk[1] - sqk[0] : 0;
        for_each_thread_fragment<TiledMma, kM, kN>(0.5f, [&](auto& tSrS, auto const& tScS) {
          apply_alibi(tSrS, tScS, rc[0], rc[1], sqk[0], sqk[1], causal_form, slope, col_ref);
          for (int i = 0; i < int(size(tSrS)); ++i) {
            const double bias = double(slope) * (alibi_bias(rc[0] + get<0>(tScS(i)), rc[1] + get<1>(tScS(i)),
                                                            sqk[0], sqk[1], causal_form) - col_ref);
            worst = std::max(worst, std::abs(double(tSrS(i)) - 0.5 - bias) / bound(0.5 + bias));
          }
        });
        if (causal_form) continue;
        for_each_thread_fragment<TiledMma, kM, kN>(0.5f, [&](auto& tSrS, auto const& tScS) {
          fill_alibi(tSrS, tScS, rc[0], rc[1], sqk[0], sqk[1], slope);
          for (int i = 0; i < int(size(tSrS)); ++i) {
            const double bias = double(slope) * alibi_bias(rc[0] + get<0>(tScS(i)), rc[1] + get<1>(tScS(i)), sqk[0],
                                                           sqk[1], false);
            worst = std::max(worst, std::abs(double(tSrS(i)) - bias) / bound(bias));
          }
        });
      }
    }
  }
  return worst;
}

// apply_alibi_side and alibi_side_shift (ALiBi's side form) against alibi_bias on every thread's
// fragment of the forward S tile, in tiles wholly left or right of every row's diagonal: the
// score plus its row's shift is the score plus the symmetric bias. Returns the largest error in
// units of its bound, 2^-22 * (|value| + slope * (|d| + kN)) (d: the row's first distance, which
// the shift's product rounds), and counts the tiles checked in `tiles`.
template <class TiledMma, int kM, int kN>
double max_alibi_side_error(long& tiles) {
  double worst = 0;
  const int shapes[][2] = {{128, 128}, {100, 300}, {300, 100}, {1, 700}, {16384, 16384}};
  const int origins[][2] = {{0, 0}, {128, 64}, {64, 256}, {16256, 16320}, {8192, 128}, {128, 8192}, {0, 512}};
  const float slope = 0.0625f / 0.088f;  // slope / softmax_scale
  for (auto const& sqk : shapes) {
    for (auto const& rc : origins) {
      const int diag_first = rc[0] + sqk[1] - sqk[0], diag_last = diag_first + kM - 1;
      const bool right = rc[1] >= diag_last, left = rc[1] + kN - 1 <= diag_first;
      if (!right && !left) continue;
      ++tiles;
      const float side_slope = right ? -slope : slope;
      for_each_thread_fragment<TiledMma, kM, kN>(0.5f, [&](auto& tSrS, auto const& tScS) {
        apply_alibi_side(tSrS, tScS, side_slope);
        Tensor s = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
        Tensor c = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));  // (rows, cols) -> (m, n)
        Tensor shift = make_tensor<float>(Shape<Int<decltype(size<0>(s))::value>>{});
        alibi_side_shift(shift, tScS, rc[0], rc[1], sqk[0], sqk[1], side_slope);
        for (int mi = 0; mi < int(size<0>(s)); ++mi) {
          const int row = rc[0] + get<0>(c(mi, 0));
          const double d_first = double(row + sqk[1] - sqk[0] - rc[1] - get<1>(c(0, 0)));
          for (int ni = 0; ni < int(size<1>(s)); ++ni) {
            const double bias = double(slope) * alibi_bias(row, rc[1] + get<1>(c(mi, ni)), sqk[0], sqk[1], false);
            const double bound = std::ldexp(std::abs(0.5 + bias) + double(slope) * (std::abs(d_first) + kN), -22);
            worst = std::max(worst, std::abs(double(s(mi, ni)) + double(shift(mi)) - 0.5 - bias) / bound);
          }
        }
      });
    }
  }
  return worst;
}

// The forward adds the symmetric form and shifts the LSE by alibi_causal_shift: on every key a
// causal row sees, the causal form must exceed the symmetric one by exactly that shift.
long count_alibi_shift_errors() {
  long bad = 0;
  const int shapes[][2] = {{128, 128}, {100, 300}, {300, 100}, {1, 700}, {16384, 16384}};
  for (auto const& sqk : shapes) {
    for (int row = 0; row < sqk[0]; row += 1 + sqk[0] / 97) {
      for (int col = 0; col < sqk[1] && col <= row + sqk[1] - sqk[0]; col += 1 + sqk[1] / 89) {
        const float causal = alibi_bias(row, col, sqk[0], sqk[1], true);
        bad += causal != alibi_bias(row, col, sqk[0], sqk[1], false) + alibi_causal_shift(row, sqk[0], sqk[1]);
      }
    }
  }
  return bad;
}

void test_alibi_apply() {
  CHECK_EQ(count_alibi_shift_errors(), 0L, "causal ALiBi form = symmetric form + alibi_causal_shift on visible keys");
  using Fwd = FwdKernelTraits<128, false, cutlass::bfloat16_t, false, Variant::kScoreMods>;
  using Bwd = BwdKernelTraits<128, cutlass::bfloat16_t>;
  const double fwd_err = max_alibi_apply_error<typename Fwd::TiledMma, Fwd::kBlockM, Fwd::kBlockN>();
  const double bwd_err = max_alibi_apply_error<typename Bwd::TiledMmaSdP, Bwd::kBlockM, Bwd::kBlockN>();
  CHECK(fwd_err <= 1, fmt("forward tile (hdim 128): apply_alibi off alibi_bias by %g of its bound", fwd_err));
  CHECK(bwd_err <= 1, fmt("backward S tile (hdim 128): apply_alibi off alibi_bias by %g of its bound", bwd_err));
  long side_tiles = 0;
  const double side_err = max_alibi_side_error<typename Fwd::TiledMma, Fwd::kBlockM, Fwd::kBlockN>(side_tiles);
  CHECK(side_tiles >= 10, fmt("the side form's check saw %ld one-sided tiles", side_tiles));
  CHECK(side_err <= 1, fmt("forward tile (hdim 128): the side form plus its shift off alibi_bias by %g of its bound",
                           side_err));
}

// AlibiBiasAt (the Hopper backward's S^T = K Q^T tile, keys along M) against alibi_bias on every
// thread's fragment, in tiles across the diagonal and on either side of it: its symmetric form
// everywhere, and on keys left of their row's diagonal, both forms as the key part (an FFMA of the
// score) plus the row part (row_part, in the exponent's units: scale times the bias). Returns the
// largest error in units of the bound 2^-22 * slope * (row + col + kN + kM) (times scale for the
// split), which holds the roundings of the float positions' products with the slope.
template <class TiledMma, int kN, int kM>
double max_alibi_bias_at_error() {
  double worst = 0;
  const int shapes[][2] = {{128, 128}, {100, 300}, {300, 100}, {1, 700}, {16384, 16384}};
  const int origins[][2] = {{0, 0}, {128, 64}, {64, 256}, {16256, 16320}, {8192, 128}, {128, 8192}};
  const float slope = 0.0625f / 0.088f, scale = 0.088f * 1.4426950408889634f;
  for (auto const& sqk : shapes) {
    for (auto const& rc : origins) {
      for_each_thread_fragment<TiledMma, kN, kM>(0.f, [&](auto&, auto const& tScS) {
        const AlibiBiasAt<0, std::decay_t<decltype(tScS)>> at(tScS, rc[0], rc[1], sqk[0], sqk[1]);
        for (int i = 0; i < int(size(tScS)); ++i) {
          const int row = rc[0] + get<1>(tScS(i)), col = rc[1] + get<0>(tScS(i));
          const double bound = std::ldexp(double(slope) * (row + col + kN + kM), -22);
          const double sym = double(slope) * alibi_bias(row, col, sqk[0], sqk[1], false);
          worst = std::max(worst, std::abs(at.symmetric(i, slope) - sym) / bound);
          if (col > row + sqk[1] - sqk[0]) continue;  // right of the diagonal: no causal kernel's row sees it
          for (bool causal_form : {false, true}) {
            const auto part = at.row_part(slope, causal_form, scale);
            const double split = double(scale) * slope * at.key_offset(i) + part.first + part.step * at.row_offset(i);
            const double want = double(scale) * slope * alibi_bias(row, col, sqk[0], sqk[1], causal_form);
            worst = std::max(worst, std::abs(split - want) / (bound * scale));
          }
        }
      });
    }
  }
  return worst;
}

void test_alibi_bias_at() {
  using Bwd64 = BwdKernelTraitsSm90<64, cutlass::bfloat16_t, bwd_sm90_block_m(64, Variant::kScoreMods)>;
  using Bwd128 = BwdKernelTraitsSm90<128, cutlass::half_t, bwd_sm90_block_m(128, Variant::kScoreMods)>;
  const double err64 = max_alibi_bias_at_error<typename Bwd64::TiledMmaSdP, Bwd64::kBlockN, Bwd64::kBlockM>();
  const double err128 = max_alibi_bias_at_error<typename Bwd128::TiledMmaSdP, Bwd128::kBlockN, Bwd128::kBlockM>();
  CHECK(err64 <= 1, fmt("sm90 backward S^T tile (hdim 64): AlibiBiasAt off alibi_bias by %g of its bound", err64));
  CHECK(err128 <= 1, fmt("sm90 backward S^T tile (hdim 128): AlibiBiasAt off alibi_bias by %g of its bound", err128));
}

// KeyBlockWalk (block_info.h): every block of the range once, from the start up, then down from
// below it; top-down when started at the top; an ALiBi walk starts at the block of the first row's
// diagonal, within the range.
void test_key_block_walk() {
  long bad = 0;
  for (int lo = 0; lo < 5; ++lo) {
    for (int hi = lo; hi < lo + 9; ++hi) {
      for (int start = lo; start < std::max(hi, lo + 1); ++start) {
        const KeyBlockWalk walk{lo, hi, start};
        std::vector<int> order;
        for (int s = 0; s < walk.steps(); ++s) order.push_back(walk.n_block(s));
        std::vector<int> want;
        for (int n = start; n < hi; ++n) want.push_back(n);
        for (int n = start - 1; n >= lo; --n) want.push_back(n);
        bad += hi > lo && order != want;
        bad += hi == lo && !order.empty();
      }
    }
  }
  const NBlockRange range{2, 9, 1, 0};
  bad += fwd_key_block_walk(range).n_block_start != 8;
  bad += fwd_key_block_walk(range, true, 5 * 64, 128, 1000, 1000).n_block_start != 2;   // row 320: block 2
  bad += fwd_key_block_walk(range, true, 7 * 128, 128, 1000, 1000).n_block_start != 7;  // row 896: block 7
  bad += fwd_key_block_walk(range, true, 0, 128, 1000, 100).n_block_start != 2;         // diagonal before the range
  bad += fwd_key_block_walk(range, true, 900, 128, 1000, 5000).n_block_start != 8;      // and past it
  CHECK_EQ(bad, 0L, "KeyBlockWalk visits the range from its start up, then down");
}

// ALiBi's side form in the warp-specialized forward (fwd_kernel_sm90_ws.h): on a walk from the
// peak, the steps after diagonal_steps that the range does not mask lie wholly right of the
// diagonals of every row of the tile (its kBlockM rows) when above the last row's diagonal block,
// else wholly left of them; and the lead steps are within the walk.
void test_diagonal_steps() {
  long n_cases = 0, bad = 0;
  for (const auto& [block_m, block_n] : std::vector<std::pair<int, int>>{{192, 64}, {128, 128}, {128, 96}, {128, 64}}) {
    const std::vector<int> values = seqlen_values(block_m, block_n);
    for (Window w : kWindows) {
      for (int sq : values) {
        for (int sk : values) {
          for (int m_block = 0; m_block * block_m < sq; ++m_block, ++n_cases) {
            const int first_row = m_block * block_m, last_row = first_row + block_m - 1;
            const NBlockRange range = fwd_n_block_range(m_block, block_m, block_n, sq, sk, w);
            KeyBlockWalk walk = fwd_key_block_walk(range, true, first_row, block_n, sq, sk);
            if (walk.steps() == 0) continue;
            const int last_diagonal_block = floor_div(last_row + sk - sq, block_n);
            walk.n_lead = diagonal_steps(walk, last_diagonal_block);
            bool ok = walk.n_lead >= 1 && walk.n_lead <= walk.steps();
            for (int s = walk.n_lead; s < walk.steps() && ok; ++s) {
              const int n = walk.n_block(s);
              if (range.is_masked(n)) continue;
              const int col_first = n * block_n, col_last = std::min(sk, (n + 1) * block_n) - 1;
              ok = n > last_diagonal_block ? col_first >= last_row + sk - sq : col_last <= first_row + sk - sq;
            }
            if (!ok) {
              ++bad;
              CHECK(false, fmt("diagonal_steps (block %dx%d, seqlen_q %d, seqlen_k %d, m_block %d, ", block_m, block_n,
                               sq, sk, m_block) + window_str(w) + "): a step after them straddles a diagonal");
            }
          }
        }
      }
    }
  }
  std::printf("  diagonal_steps: %ld tiles, %ld failing\n", n_cases, bad);
  CHECK(n_cases > 1000, "diagonal_steps saw too few tiles");
  CHECK_EQ(bad, 0L, "the side form's steps lie on one side of every diagonal of the tile");
}

// The warp-specialized forward's consumers (fwd_kernel_sm90_ws.h) on the tile's top-down walk: each
// takes the steps of its own 64 rows' blocks (fwd_n_block_range of those rows) and skips the others,
// deciding masked or not as fwd_walk does with its own range (the tile's first step, or a block
// its range masks). The kernel relies on: its own blocks lie within the tile's, the walk meets each
// once, one after another; a step it runs unmasked is its own and follows one of its own (its P
// awaits that P V); and once it skipped a block after its own ones, none of its own follow.
void test_consumer_walk() {
  long n_cases = 0, bad = 0;
  for (const auto& [block_m, block_n] : std::vector<std::pair<int, int>>{{128, 128}, {192, 128}, {192, 64}}) {
    const int consumers = block_m / 64;
    const std::vector<int> values = seqlen_values(block_m, block_n);
    for (Window w : kWindows) {
      for (int sq : values) {
        for (int sk : values) {
          for (int m_block = 0; m_block * block_m < sq; ++m_block) {
            const NBlockRange tile = fwd_n_block_range(m_block, block_m, block_n, sq, sk, w);
            const KeyBlockWalk walk = fwd_key_block_walk(tile);
            for (int c = 0; c < consumers && m_block * block_m + 64 * c < sq; ++c, ++n_cases) {
              const NBlockRange own = fwd_n_block_range(m_block * consumers + c, 64, block_n, sq, sk, w);
              const bool has_own = own.n_block_max > own.n_block_min;
              bool ok = !has_own || (own.n_block_min >= tile.n_block_min && own.n_block_max <= tile.n_block_max);
              bool pending = false, done = false;
              int own_steps = 0;
              for (int s = 0; s < walk.steps() && ok; ++s) {
                const int n = walk.n_block(s);
                const bool is_own = n >= own.n_block_min && n < own.n_block_max;
                if (s == 0 || own.is_masked(n)) {
                  if (!is_own) {
                    done = done || pending;
                    pending = false;
                    continue;
                  }
                } else {
                  ok = is_own && pending;
                }
                ok = ok && !done;
                pending = true;
                ++own_steps;
              }
              ok = ok && own_steps == (has_own ? own.n_block_max - own.n_block_min : 0);
              if (!ok) {
                ++bad;
                CHECK(false, fmt("consumer %d of tile %d (block_m %d, block_n %d, seqlen_q %d, seqlen_k %d, ", c,
                                 m_block, block_m, block_n, sq, sk) + window_str(w) + "): its steps break the walk's rule");
              }
            }
          }
        }
      }
    }
  }
  std::printf("  consumer_walk: %ld (tile, consumer) cases, %ld failing\n", n_cases, bad);
  if (bad == 0) ++g_passed;
}

// FwdMask::alibi_max_bias (mask.h) against the largest bias over the keys key_visible admits, for
// rows before, inside and past the keys, every kind of window, slopes of both signs and 0.
void test_alibi_max_bias() {
  const Window windows[] = {{-1, -1}, {-1, 0}, {0, 0}, {3, -1}, {-1, 2}, {5, 7}, {0, 40}, {40, 0}, {100, 100}};
  const float slopes[] = {1.f, 0.25f, 0.f, -0.5f, -3.f};
  long bad = 0, cases = 0;
  for (int sq : {1, 7, 40, 77}) {
    for (int sk : {1, 9, 40, 64}) {
      for (Window w : windows) {
        const FwdMask mask{sq, sk, w};
        for (int row = 0; row < sq; ++row) {
          for (float slope : slopes) {
            float want = 0.f;
            bool any = false;
            for (int col = 0; col < sk; ++col) {
              if (!mask.key_visible(row, col)) continue;
              const float b = slope * alibi_bias(row, col, sq, sk, false);
              want = any ? std::max(want, b) : b;
              any = true;
            }
            bad += mask.alibi_max_bias(row, slope) != want;
            ++cases;
          }
        }
      }
    }
  }
  CHECK_EQ(bad, 0L, fmt("alibi_max_bias is the largest visible bias (%ld cases)", cases));
}

// exp2_fma (softmax.h) against exp2 in double over its domain: every 1/4096 of [-125, 127], each
// side of the rounding points n + 1/2, and below -125 (2^-125 there, never 0 or garbage).
void test_exp2_fma() {
  double worst = 0, worst_x = 0;
  auto check = [&](float x) {
    const double err = std::abs(double(exp2_fma(x)) / std::exp2(double(x)) - 1.0);
    if (err > worst) worst = err, worst_x = x;
  };
  for (int i = -125 * 4096; i <= 127 * 4096; ++i) check(float(i) / 4096.f);
  for (int n = -125; n < 127; ++n) {
    check(std::nextafter(n + 0.5f, -1e9f));
    check(n + 0.5f);
    check(std::nextafter(n + 0.5f, 1e9f));
  }
  CHECK(worst < 7.6e-5, fmt("exp2_fma's relative error %g at x = %.9g (the polynomial's bound: 7.5e-5)", worst, worst_x));
  for (float x : {-125.5f, -150.f, -1e30f}) {
    CHECK(exp2_fma(x) == exp2_fma(-125.f), fmt("exp2_fma(%g) = %g, not 2^-125's value", x, exp2_fma(x)));
  }
  CHECK(exp2_fma(0.f) > 0.99992f && exp2_fma(0.f) < 1.00008f, fmt("exp2_fma(0) = %.9g", exp2_fma(0.f)));
}

// BoundedScores (bounded_scores.h): for every cap it admits, the fixed offset keeps each term
// exp2(t * scale_log2 - offset), t in [-1, 1], in [2^kLeastLog2, 2^kMostLog2]; caps past 57.5 are
// refused, and those up to 100 listed. scale_log2 as the glue computes it: float(cap * log2(e)).
void test_bounded_scores() {
  long bad = 0;
  float largest_fitting = 0;
  for (double cap = 0.01; cap < 80.0; cap *= 1.001) {
    const float scale_log2 = float(cap * 1.4426950408889634);
    if (!BoundedScores::fits(scale_log2)) continue;
    largest_fitting = std::max(largest_fitting, float(cap));
    const float offset = BoundedScores::offset_log2(scale_log2);
    const float top = scale_log2 - offset, bottom = -scale_log2 - offset;
    bad += top > BoundedScores::kMostLog2 || bottom < BoundedScores::kLeastLog2 || offset < 0.f;
    bad += !(std::isnormal(std::exp2(bottom)) && std::isfinite(std::exp2(top)));
  }
  CHECK_EQ(bad, 0L, "every admitted cap keeps the terms within [2^kLeastLog2, 2^kMostLog2]");
  CHECK(largest_fitting > 57.4f && largest_fitting < 57.6f, fmt("largest admitted cap %g, not 57.5", largest_fitting));
  CHECK(BoundedScores::offset_log2(float(30.0 * 1.4426950408889634)) == 0.f, "a cap of 30 needs no offset");
  CHECK(BoundedScores::kLeastTerm == std::exp2(BoundedScores::kLeastLog2), "kLeastTerm is 2^kLeastLog2");
  // The listing pass: caps past 57.5 up to 100, where a row whose largest logit is -15 or more
  // keeps a term of 2^kLeastLog2.
  float least_listed = 1e9f, largest_listed = 0.f;
  for (double cap = 0.01; cap < 400.0; cap *= 1.001) {
    const float scale_log2 = float(cap * 1.4426950408889634);
    if (!BoundedScores::listed(scale_log2)) continue;
    least_listed = std::min(least_listed, float(cap));
    largest_listed = std::max(largest_listed, float(cap));
    const float t = float(std::tanh(-15.0 / cap));  // the tanh value of a logit of -15
    bad += t * scale_log2 - BoundedScores::offset_log2(scale_log2) < BoundedScores::kLeastLog2;
  }
  CHECK_EQ(bad, 0L, "a listed cap keeps a logit of -15 at a term of 2^kLeastLog2 or more");
  CHECK(least_listed > 57.4f && least_listed < 57.6f, fmt("least listed cap %g, not just past 57.5", least_listed));
  CHECK(largest_listed > 99.9f && largest_listed < 100.1f, fmt("largest listed cap %g, not 100", largest_listed));
}

// The Hopper forwards' softcap loops (fwd_mainloop.h): which exponentiate with BoundedScores' fixed
// offset. bf16 only; in the kernels of larger caps (kCheckedNoBias, kCheckedAlibi) not always: each
// tile takes it once its first few steps show that it holds. kCheckedNoBias holds the loop without
// a bias alone.
void test_softcap_loops() {
  using bf16 = cutlass::bfloat16_t;
  using fp16 = cutlass::half_t;
  using L = Sm90Loops;
  CHECK((sm90_fixed_offset_step<true, bf16, L::kPerTile, false>), "bf16 softcap without ALiBi: the fixed offset");
  CHECK((!sm90_fixed_offset_step<true, bf16, L::kPerTile, true>), "bf16 softcap's per-tile ALiBi loop: online");
  CHECK((!sm90_fixed_offset_step<true, fp16, L::kPerTile, false>), "fp16 softcap: online");
  CHECK((!sm90_fixed_offset_step<false, bf16, L::kPerTile, false>), "no softcap: online");
  CHECK((sm90_fixed_offset_step<true, bf16, L::kNoBias, false>), "kNoBias: the fixed offset");
  CHECK((sm90_fixed_offset_step<true, bf16, L::kAlibiFixedOffset, true>), "kAlibiFixedOffset: the fixed offset");
  CHECK((!sm90_fixed_offset_step<true, bf16, L::kCheckedNoBias, false>), "kCheckedNoBias (caps above 57.5): checked");
  CHECK((!sm90_fixed_offset_step<true, bf16, L::kCheckedAlibi, true>), "kCheckedAlibi (caps above 57.5): checked");
  CHECK(sm90_checks_offset<L::kCheckedNoBias> && sm90_checks_offset<L::kCheckedAlibi> &&
            !sm90_checks_offset<L::kNoBias> && !sm90_checks_offset<L::kAlibiFixedOffset> &&
            !sm90_checks_offset<L::kPerTile>,
        "the checked kernels");
  CHECK(sm90_no_bias_loop_only<L::kCheckedNoBias> && !sm90_alibi_loop_only<L::kCheckedNoBias>,
        "kCheckedNoBias holds the loop without a bias alone");
  CHECK(sm90_no_bias_loop_only<L::kNoBias> && sm90_alibi_loop_only<L::kCheckedAlibi> &&
            sm90_alibi_loop_only<L::kAlibiFixedOffset> && !sm90_no_bias_loop_only<L::kPerTile> &&
            !sm90_alibi_loop_only<L::kPerTile>,
        "the other kernels' loops");
  CHECK(sm90_lists_redo<L::kNoBias> && sm90_lists_redo<L::kAlibiFixedOffset> && !sm90_lists_redo<L::kCheckedNoBias> &&
            !sm90_lists_redo<L::kCheckedAlibi> && !sm90_lists_redo<L::kPerTile>,
        "the fixed-offset kernels run the listing pass");
}

// ----------------------------------------------------------------------------------------------

struct Case {
  const char* name;
  void (*fn)();
};
const Case kCases[] = {
    {"tile_table", test_tile_table},
    {"mask", test_mask},
    {"mask_apply", test_mask_apply},
    {"alibi_apply", test_alibi_apply},
    {"alibi_bias_at", test_alibi_bias_at},
    {"alibi_max_bias", test_alibi_max_bias},
    {"n_block_range", test_n_block_range},
    {"key_block_walk", test_key_block_walk},
    {"consumer_walk", test_consumer_walk},
    {"diagonal_steps", test_diagonal_steps},
    {"m_block_range", test_m_block_range},
    {"bwd_tile_table", test_bwd_tile_table},
    {"dq_accum_offset", test_dq_accum_offset},
    {"dq_fragment", test_dq_fragment},
    {"dq_order", test_dq_order},
    {"split_heuristic", test_split_heuristic},
    {"split_range", test_split_range},
    {"split_combine", test_split_combine},
    {"block_info", test_block_info},
    {"tma_fits", test_tma_fits},
    {"varlen_rows", test_varlen_rows},
    {"ws_tile_order", test_ws_tile_order},
    {"dropout_rng", test_dropout_rng},
    {"dropout_layout", test_dropout_layout},
    {"exp2_fma", test_exp2_fma},
    {"bounded_scores", test_bounded_scores},
    {"softcap_loops", test_softcap_loops},
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<const Case*> chosen;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--print-head-dims") == 0) {
      bool first = true;
      for (int d : kFwdHeadDims) {
        std::printf(first ? "%d" : " %d", d);
        first = false;
      }
      std::printf("\n");
      return 0;
    }
    if (std::strcmp(argv[a], "--list") == 0) {
      for (const Case& c : kCases) std::printf("%s\n", c.name);
      return 0;
    }
    const Case* found = nullptr;
    for (const Case& c : kCases) {
      if (std::strcmp(argv[a], c.name) == 0) found = &c;
    }
    if (found == nullptr) {
      std::fprintf(stderr, "unknown test case %s (try --list)\n", argv[a]);
      return 2;
    }
    chosen.push_back(found);
  }
  if (chosen.empty()) {
    for (const Case& c : kCases) chosen.push_back(&c);
  }
  for (const Case* c : chosen) {
    const long failed_before = g_failed, passed_before = g_passed;
    g_failed_in_case = 0;
    c->fn();
    std::printf("[%s] %s: %ld checks passed, %ld failed\n", g_failed == failed_before ? "PASS" : "FAIL",
                c->name, g_passed - passed_before, g_failed - failed_before);
  }
  std::printf("%ld passed, %ld failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
