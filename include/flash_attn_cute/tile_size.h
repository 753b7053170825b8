// The one table of forward tile shapes. Host code picks a row of it, kernels receive it as types.
// Host-and-device constexpr, no CuTe: the C++ unit tests read it on the CPU.
#pragma once

namespace flash_attn_cute {

// The kernel instantiations of one (dtype, head dim, causal, even K): plain (causal / full mask
// at compile time), score mods (softcap, ALiBi, local windows at run time) and dropout (dropout
// plus all the score mods at run time).
enum class Variant : int { kPlain = 0, kScoreMods = 1, kDropout = 2 };

struct FwdTileShape {
  int block_m;  // query rows per CTA
  int block_n;  // key rows per mainloop step
  int n_warps;  // warps per CTA, stacked along M
};

// Head dims that have a kernel; any other head dim <= 256 (a multiple of 8) runs on the next one up
// with the columns past head_dim predicated off.
inline constexpr int kFwdHeadDims[] = {32, 64, 96, 128, 192, 256};
inline constexpr int kMaxHeadDim = 256;

constexpr int fwd_kernel_head_dim(int head_dim) {
  for (int d : kFwdHeadDims) {
    if (head_dim <= d) return d;
  }
  return 0;  // too large: no kernel
}

// The score-mod kernels (softcap's tanh, ALiBi, windows) and the dropout kernels (random bits for
// every score) hold more registers than the plain ones. Where the plain tiles would spill them,
// N tiles half as wide leave room (FA2 narrows its dropout tiles the same way): both at head dim
// 64 (the plain 128-wide tiles spill about 400 bytes), dropout at 96 and 128 (64-wide: about 400).
// small_smem: the tiles of GPUs that allow a block less shared memory than these take (fwd_small_smem):
// at head dim 256 the causal kernels' 96 KB for sm_86 / sm_89's 99 KB.
constexpr FwdTileShape fwd_tile_shape(int kernel_head_dim, bool is_causal, Variant variant = Variant::kPlain,
                                      bool small_smem = false) {
  // 128 x 128 with 4 warps: small head dims keep S in few registers, so wide N tiles amortise
  // the softmax's row reductions.
  if (kernel_head_dim <= 64) return {128, variant != Variant::kPlain ? 64 : 128, 4};
  // From 96 on, S (128 x 128) and O no longer both fit in 255 registers per thread: 64-wide N.
  if (kernel_head_dim <= 128) return {128, variant == Variant::kDropout ? 32 : 64, 4};
  // 256 causal: 64-row blocks give twice the CTAs, two per SM (96 KB of smem each), which evens
  // out the triangle's uneven row blocks at short seqlens.
  if (kernel_head_dim == 256 && (is_causal || small_smem)) return {64, 64, 4};
  // 192 and 256: O alone is 64+ registers per thread at 4 warps, so 8 warps share the rows.
  return {128, 64, 8};
}

// The split-KV kernel (decode: a few query rows over many keys) is bound by reading K and V. One warp
// per CTA on one 16-row slab: no warp re-reads a K / V tile another warp already read from shared
// memory, and small CTAs (20 KB of shared memory at head dim 128) let eight share an SM (as many
// as their registers allow), so many tiles are in flight per SM. More query rows simply take more
// row blocks. At head dims 32, 64, 128 and 256 a step reads K and V tiles of 4096 elements each (at
// 64, 128-key tiles left S in 64 registers per thread and spilled; at 192 and 256, 32-key tiles gave
// each lane 32 rows of K and V to load and spilled 236-292 bytes).
constexpr FwdTileShape fwd_split_tile_shape(int kernel_head_dim) {
  if (kernel_head_dim <= 32) return {16, 128, 1};
  if (kernel_head_dim <= 64) return {16, 64, 1};
  if (kernel_head_dim <= 128) return {16, 32, 1};
  return {16, 16, 1};
}

// The Hopper forward (sm_90a, fwd_kernel_sm90.h): one warpgroup per CTA owns 64 query rows (one
// warpgroup MMA's M) and steps over 64 keys; small CTAs (48 KB of shared memory at head dim 128)
// share an SM, so one CTA's softmax runs beside another's MMAs. Measured on H200 (session 17, bf16):
// at hdim 128, 1.13-1.38x FA2 against 0.82-1.38x with 128-key steps (two CTAs per SM) and
// 0.94-1.34x with two warpgroups sharing 128 x 128 tiles (one CTA per SM).
constexpr FwdTileShape fwd_sm90_tile_shape(int /* kernel_head_dim */) { return {64, 64, 4}; }

// Its CTAs per SM, the register cap of __launch_bounds__. Plain: four up to head dim 64 (128
// registers per thread, no spills; hdim 64 causal 5-12 % faster than three), three up to 128 (168:
// S and O take 96), two above (at 256 O alone takes 128). Score mods: three up to 128 (168
// registers, no spills, since the softcap case is a kernel of its own; against two at hdim 128,
// session 18: softcap 12 % and softcap + ALiBi 13 % faster causal, ALiBi 2-7 %). Dropout: one fewer
// than plain up to 128 (at three its Philox state spilled 72-200 bytes).
constexpr int fwd_sm90_ctas_per_sm(int kernel_head_dim, Variant variant) {
  const int plain = kernel_head_dim <= 64 ? 4 : kernel_head_dim <= 128 ? 3 : 2;
  if (variant == Variant::kPlain || kernel_head_dim > 128) return plain;
  return variant == Variant::kScoreMods ? 3 : plain - 1;
}

// The warp-specialized Hopper forward (fwd_kernel_sm90_ws.h), one persistent CTA per SM: a
// producer warpgroup and two consumer warpgroups of 64 query rows each (128-row tiles; three and
// 192 rows where fwd_sm90_ws_tile_shape's three_consumers says), K and V in rings of
// kFwdSm90WsStages buffers; 128-key steps up to head dim 128, 96 at 192 and 64 at 256 (O
// takes 96 and 128 registers per thread there). Measured on H200 (session 20, bf16, against the
// three-CTA kernel above in the same build): at hdim 128, 564-567 TFLOP/s against 457 at 16k
// tokens, causal 352-357 against 317 at 1024 and even (233-236 against 237) at causal 512, where
// rows see 256 keys on average; at hdim 64, 380-394 against 350-365 from 8k on, even where rows
// see 1024 keys (causal 2048: 306 against 301) and 5-19 % slower at 512 keys (non-causal 512:
// 258 against 271, causal 1024: 240 against 262). Session 19's non-persistent form had needed
// 2048 keys at hdim 128 and 512 above, where longer steps hide a tile's start and epilogue better.
// With TMA loads (session 22, two runs each) hdim 64 pays from 512 keys: non-causal 512 298 against
// 273, causal 1024 270-271 against 266; at 256 (causal 512) it is 6 % slower, 191 against 202-203.
// With cp.async loads (left padding, kv_batch_idx, paged caches, unaligned strides; varlen and
// seqused_k until session 69) hdim 64 keeps 1024.
// bf16 softcap's fixed-offset kernels (softcap_fixed_offset, caps up to 57.5; FwdKernelTraitsSm90Ws
// passes three_consumers here) at head dims 64 to 128 have three consumer warpgroups
// (192-row tiles; 64-key steps from 96 on, for S's registers) at 160 registers each (15 to 47 spill
// stores, outside the key loop). A score's tanh and exp2 take the MUFU unit as long as the MMAs
// take the tensor cores; with a third warpgroup one more tile's softmax runs while the others' MMAs
// do. Session 31 (16k tokens, against plain in the same run): hdim 128 causal 0.91-0.94 of plain
// against 0.86-0.88 (three calls), non-causal 0.86-0.93 against 0.83-0.88, a cap of 50 0.91-0.93
// against 0.79-0.87; hdim 96 0.93-0.94 / 0.91-0.92 against 0.86 / 0.85-0.86 (with 128-key steps
// 0.82-0.83 / 0.84-0.87: S spilled into the key loop); hdim 64 0.89-0.99 against 0.80-0.84. With
// three, ALiBi and dropout were 2-4 % slower (session 30) and softcap's online loop (ALiBi, larger
// caps) gained nothing: they keep two. Since session 37 the larger caps' kernels take the fixed
// offset once it holds (Sm90Loops' checked kernels), and this tile with it.
constexpr bool fwd_sm90_warp_specialized(int kernel_head_dim) { return kernel_head_dim >= 64; }
// three_consumers: the 192-row tiles of the kernels with three consumer warpgroups (softcap's fixed
// offset, and at head dim 64 the plain and score-mod kernels' long rows: fwd_sm90_ws_three_consumers_pay).
constexpr FwdTileShape fwd_sm90_ws_tile_shape(int kernel_head_dim, bool three_consumers = false) {
  if (three_consumers && kernel_head_dim >= 64 && kernel_head_dim <= 128) return {192, kernel_head_dim == 64 ? 128 : 64, 16};
  if (kernel_head_dim <= 128) return {128, 128, 12};
  return {128, kernel_head_dim <= 192 ? 96 : 64, 12};
}
// The keys a query row must see on average for the warp-specialized kernel to pay, where
// fwd_sm90_ws_pays has no rule of its own for the call.
constexpr int fwd_sm90_ws_min_mean_keys(int kernel_head_dim, bool tma = true) {
  return kernel_head_dim > 64 ? 256 : tma ? 512 : 1024;
}
// Sequences of at most this many keys are short for fwd_sm90_ws_pays.
inline constexpr int kFwdSm90WsShortKeys = 256;

// The keys a query row sees on average (params.h's Window: left / right, -1 unbounded), near enough
// for a choice of kernel: the mean over 64 rows spread evenly over the sequence.
constexpr double fwd_mean_keys_per_row(int seqlen_q, int seqlen_k, int left, int right) {
  constexpr int kSamples = 64;
  double total = 0;
  for (int t = 0; t < kSamples; ++t) {
    const long row = long((t + 0.5) * seqlen_q / kSamples);
    const long diag = row + seqlen_k - seqlen_q;
    const long hi = right < 0 ? seqlen_k : (diag + right + 1 < seqlen_k ? diag + right + 1 : seqlen_k);  // exclusive
    const long lo = left < 0 || diag - left < 0 ? 0 : diag - left;
    total += hi > lo ? double(hi - lo) : 0.0;
  }
  return total / kSamples;
}

// Whether the warp-specialized kernel pays for a call. softcap: a softcap call; score_mods: a call
// of the score-mod or dropout kernels (not the plain ones: causal, a left window); tma: whether its
// loads would be TMA's (fwd_ws_tma_fits). Its tiles' starts and epilogues overlap other tiles' MMAs
// (the three-CTA kernel's do not), which short rows feel most; the three-CTA kernel's 64 x 64 tiles
// mask less of a window edge (causal, local) away. So it takes full rows (no window edge: not
// causal, no local window) at every length, but softcap's at head dim 64; sequences of up to 256
// keys at head dims 96 and 128 but softcap's with a window edge, above 128 the plain kernels'; the
// rest where rows see fwd_sm90_ws_min_mean_keys on average. Measured on H200 (session 41, bf16, 16k
// tokens at 128 to 1024 a sequence, both kernels of one build, us): hdim 128 plain non-causal 128
// 75 against 106 (cuDNN 73), causal 128 75 against 92, causal 256 86 against 107, non-causal 256
// softcap 141 against 144, ALiBi 10-20 % and dropout 13-26 % faster, causal softcap 256 130 against
// 109; hdim 96 non-causal 128 82 against 117, causal 256 108 against 114, window (64, 64) at 512 157
// against 138; hdim 64 non-causal 128 109 against 121, 256 142 against 162, softcap 256 219
// against 208, causal 256 138 against 119; hdims 192 and 256 non-causal 7-19 % faster at every
// length, causal 256 5-11 %, window (64, 0) at 128 13-21 % (causal 128 1-2 % slower), their causal
// score mods at 128-256 on the three-CTA kernel, at 256 the SM80 one's, up to 30 % slower.
constexpr bool fwd_sm90_ws_pays(int kernel_head_dim, int seqlen_q, int seqlen_k, int left, int right, bool softcap,
                                bool score_mods, bool tma = true) {
  if (!fwd_sm90_warp_specialized(kernel_head_dim)) return false;
  const bool full_rows = left < 0 && right < 0;
  if (full_rows && (kernel_head_dim > 64 || !softcap)) return true;
  if (seqlen_k <= kFwdSm90WsShortKeys && kernel_head_dim > 64 && (kernel_head_dim <= 128 ? !softcap : !score_mods)) {
    return true;
  }
  return fwd_mean_keys_per_row(seqlen_q, seqlen_k, left, right) >= fwd_sm90_ws_min_mean_keys(kernel_head_dim, tma);
}
// At head dim 64 the plain, score-mod and dropout warp-specialized kernels of one loop per tile
// (ALiBi, windows, fp16 softcap; bf16 softcap runs its own kernels, three consumers already) come
// in two tiles: 128 rows for two consumer warpgroups and 192 for three. There a 128-key step's
// exponentials keep the MUFU unit as busy as its MMAs keep the tensor cores, so two consumers, each
// running its softmax while the other's MMAs run, leave the tensor cores idle whenever a softmax
// runs late; a third keeps one more softmax in flight (as in softcap's fixed-offset kernels). The
// taller tiles leave more rows of a sequence's last tile empty, and with a window edge (causal,
// local) that last tile holds the rows that see the most keys: in session 42 they paid from 512
// keys a row, with a window edge only in sequences of 2048 rows or more. Measured on H200 (session
// 42, bf16, 16k tokens a call, us, three consumers against two): non-causal 16k 4782 against 5296
// (cuDNN 4815), 4k 1264 against 1343, 2k 654 against 703, 1k 381 against 384, 512 220 against 226,
// 256 181 against 143, 128 125 against 108; causal 16k 2433 against 2746 (cuDNN 2492), 4k 703
// against 758, 2k 394 against 427, 1k 277 against 263; at 16k ALiBi 2581 against 3067 causal and
// 4774 against 6269 non-causal, windows (1024, 0) 418 against 458 and (512, 512) 424 against 478;
// varlen (cp.async loads) 8-13 % faster. The dropout kernel has three too, drawing its Philox words
// where it uses them (fwd_kernel_sm90_ws.h): held across the MMA wait, they spilled 232-360 bytes
// in the key loop (sessions 42, 44); drawn late, three consumers took the 16k dropout forward from
// 3.38 to 3.03 ms causal and 6.91 to 5.84 non-causal (session 46). At head dim 96 (192 x 64 tiles)
// three were 3 % faster at 16k non-causal and 1-7 % slower at 1k-2k: it keeps two.
constexpr bool fwd_sm90_ws_has_three_consumers(int kernel_head_dim) { return kernel_head_dim == 64; }
// Since the consumers skip the key blocks their rows do not see and the tiles past a sequence's end
// (fwd_kernel_sm90_ws.h), the taller tiles do no more consumer steps than the 128-row ones on any
// shape, and the window-edge condition (sequences of 2048 rows or more) is gone: causal 1k went
// from 253 to 231 us with three (session 46), the other rows within 1 % of two.
constexpr bool fwd_sm90_ws_three_consumers_pay(int kernel_head_dim, int seqlen_q, int seqlen_k, int left, int right) {
  return fwd_sm90_ws_has_three_consumers(kernel_head_dim) &&
         fwd_mean_keys_per_row(seqlen_q, seqlen_k, left, right) >= 512;
}
// The score-mod and dropout forwards at head dim 256 exist warp-specialized only: the three-CTA
// kernel spilled there (156 and 1040 spill instructions at 255 registers). Where rows see too few
// keys for the warp-specialized kernel, those calls take the SM80 kernel (fwd_sm90_takes_ws).
constexpr bool fwd_sm90_ws_only(int kernel_head_dim, Variant variant) {
  return kernel_head_dim > 192 && variant != Variant::kPlain;
}
inline constexpr int kFwdSm90WsStages = 2;
inline constexpr int kFwdSm90WsBarrierBytes = 128;  // the rings' and Q's mbarriers

// Shared memory of the warp-specialized forward with `buffers` (kBlockM, head_dim) tiles of Q and O
// beside the K and V rings (16-bit elements), and the barriers.
constexpr int fwd_sm90_ws_bytes(FwdTileShape tile, int kernel_head_dim, int buffers) {
  return (buffers * tile.block_m + 2 * kFwdSm90WsStages * tile.block_n) * kernel_head_dim * 2 + kFwdSm90WsBarrierBytes;
}

// Whether the output tile gets shared memory of its own (else it reuses Q's): up to head dim 128,
// where it fits. Then the producer may load the next tile's Q, and its K and V, while the consumers
// still run the last P V and the epilogue.
constexpr bool fwd_sm90_ws_separate_o(FwdTileShape tile, int kernel_head_dim) {
  return fwd_sm90_ws_bytes(tile, kernel_head_dim, 2) <= 227 * 1024;
}

// Q's buffers: two where O has its own and a second Q fits beside it (up to head dim 128), else
// one. With two, the producer loads the next tile's Q, and then its first K and V, as soon as it
// has issued this tile's loads, not only once the consumers are done with this tile's Q: session
// 35 (hdim 128, 16k tokens) 1k-token sequences 2-3 % faster, 2k and window (1024, 0) 1 %, 16k
// within 0.5 %.
constexpr int fwd_sm90_ws_q_stages(FwdTileShape tile, int kernel_head_dim) {
  return fwd_sm90_ws_separate_o(tile, kernel_head_dim) && fwd_sm90_ws_bytes(tile, kernel_head_dim, 3) <= 227 * 1024
             ? 2
             : 1;
}

// Its shared memory: Q's buffers, the K and V rings, O where it has its own, the barriers.
constexpr int fwd_sm90_ws_smem_bytes(FwdTileShape tile, int kernel_head_dim) {
  const int o_buffers = fwd_sm90_ws_separate_o(tile, kernel_head_dim) ? 1 : 0;
  return fwd_sm90_ws_bytes(tile, kernel_head_dim, fwd_sm90_ws_q_stages(tile, kernel_head_dim) + o_buffers);
}

// Shared memory of a forward CTA: Q, one K and one V tile (16-bit elements).
constexpr int fwd_smem_bytes(FwdTileShape tile, int kernel_head_dim) {
  return (tile.block_m + 2 * tile.block_n) * kernel_head_dim * 2;
}

// Whether the SM80 forward (not split) takes fwd_tile_shape's small tiles on a GPU that allows
// smem_optin bytes of shared memory a block: where the default tiles do not fit and smaller ones exist
// (head dim 256 full and dropout on sm_86 / sm_89).
constexpr bool fwd_small_smem(int kernel_head_dim, bool is_causal, Variant variant, int smem_optin) {
  const int default_bytes = fwd_smem_bytes(fwd_tile_shape(kernel_head_dim, is_causal, variant), kernel_head_dim);
  return default_bytes > smem_optin &&
         fwd_smem_bytes(fwd_tile_shape(kernel_head_dim, is_causal, variant, true), kernel_head_dim) < default_bytes;
}

struct BwdTileShape {
  int block_m;     // query rows per mainloop step
  int block_n;     // key rows per CTA (dK, dV stay in registers for the whole CTA)
  int n_warps;
  int atom_m_sdp;  // warps along M for S = Q K^T and dP = dO V^T (the rest go along N)
  int atom_n_dkv;  // warps along N for dK, dV (the rest go along head_dim)
  int atom_m_dq;   // warps along M for dQ = dS K (the rest go along head_dim)
  int q_slots = 2;  // buffers of Q and dO: with 2 the next row block loads during this one
  // V lives in registers (S / dP's B fragments) from the CTA's start, and P and dS take its shared
  // memory: bwd_v_in_regs_tile_shape, which runs no dropout (its warps hold 16 key columns of S, not
  // dropout's 32).
  bool v_in_regs = false;
};

// Backward tiles: one 8-warp CTA per SM, all of Q, dO (double-buffered), K, V, P and dS in shared
// memory; dK and dV take 2 * block_n * head_dim / 256 accumulator registers per thread.
// small_smem: the tiles of GPUs that allow a block less shared memory than these take (114-209 KB),
// as bwd_small_smem picks them: up to head dim 192 within the 99 KB of sm_86 / sm_89 (head dim 96
// and up on 64 key rows, from 128 with Q and dO single-buffered, at 192 four warps on 32 key rows);
// at 256 within sm_80's 163 KB (Q and dO single-buffered; sm_86 / sm_89 take bwd_v_in_regs_tile_shape).
constexpr BwdTileShape bwd_tile_shape(int kernel_head_dim, bool small_smem = false) {
  if (small_smem) {
    if (kernel_head_dim <= 64) return {64, 128, 8, 2, 4, 4};     // 96 KB at 64
    if (kernel_head_dim <= 96) return {64, 64, 8, 4, 4, 4};      // 88 KB
    if (kernel_head_dim <= 128) return {64, 64, 8, 4, 2, 2, 1};  // 80 KB
    if (kernel_head_dim <= 192) return {64, 32, 4, 4, 2, 2, 1};  // 80 KB
    return {64, 64, 8, 4, 2, 2, 1};                                // 144 KB
  }
  // dK + dV are only 64 registers: a 128-row M step halves the m-loop trips (measured 2% faster
  // than 64 rows on H200 despite a few spilled registers).
  if (kernel_head_dim <= 64) return {128, 128, 8, 2, 4, 4};
  // dK + dV take up to 128 registers: 64-row M steps keep S and dP at 32 each. dQ's warps split
  // head_dim into 16-column slabs per warp: 2 warps along 96, 4 along 128.
  if (kernel_head_dim <= 96) return {64, 128, 8, 2, 4, 4};
  if (kernel_head_dim <= 128) return {64, 128, 8, 2, 4, 2};
  // dK + dV take 128 registers at 64 key rows; shared memory (208 KB at 256) bounds the tiles.
  return {64, 64, 8, 4, 2, 2};
}

// At head dim 256 on GPUs that allow a block less than the small tile's 144 KB (sm_86 / sm_89), as
// flash-attn 2.x: 32 key rows, Q and dO single-buffered, V in registers (64 per thread) with P and dS
// in its shared memory, 97 KB. Not with dropout (bwd_v_in_regs).
constexpr BwdTileShape bwd_v_in_regs_tile_shape() { return {64, 32, 8, 4, 2, 2, 1, true}; }

// Shared memory of the SM80 backward (BwdKernelTraits): Q and dO (q_slots each), K, V, P, dS (16-bit
// elements; P and dS inside V's with v_in_regs), then the fp32 LSE and D of q_slots row blocks and
// DqAccumulator's hand-on slots (DqHandOn: 24 bytes).
constexpr int bwd_smem_bytes(BwdTileShape tile, int kernel_head_dim) {
  return (2 * tile.q_slots * tile.block_m * kernel_head_dim + 2 * tile.block_n * kernel_head_dim +
          (tile.v_in_regs ? 0 : 2 * tile.block_m * tile.block_n)) * 2 +
         tile.q_slots * 2 * tile.block_m * 4 + 24;
}

// Whether the SM80 backward takes bwd_tile_shape's small tiles on a GPU that allows smem_optin bytes
// of shared memory a block: where the default tiles do not fit and small ones exist.
constexpr bool bwd_small_smem(int kernel_head_dim, int smem_optin) {
  const int default_bytes = bwd_smem_bytes(bwd_tile_shape(kernel_head_dim), kernel_head_dim);
  return default_bytes > smem_optin && bwd_smem_bytes(bwd_tile_shape(kernel_head_dim, true), kernel_head_dim) < default_bytes;
}

// Whether it takes bwd_v_in_regs_tile_shape instead: head dim 256 without dropout, where even the
// small tile does not fit.
constexpr bool bwd_v_in_regs(int kernel_head_dim, Variant variant, int smem_optin) {
  return kernel_head_dim == 256 && variant != Variant::kDropout &&
         bwd_smem_bytes(bwd_tile_shape(kernel_head_dim, true), kernel_head_dim) > smem_optin;
}

// The SM80 backward's tile for a call on such a GPU (smem_optin 0: not known, the default tiles).
constexpr BwdTileShape bwd_tile_for(int kernel_head_dim, Variant variant, int smem_optin) {
  if (smem_optin <= 0) return bwd_tile_shape(kernel_head_dim);
  if (bwd_v_in_regs(kernel_head_dim, variant, smem_optin)) return bwd_v_in_regs_tile_shape();
  return bwd_tile_shape(kernel_head_dim, bwd_small_smem(kernel_head_dim, smem_optin));
}

}  // namespace flash_attn_cute
