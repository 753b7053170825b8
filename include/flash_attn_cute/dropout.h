// Dropout on the attention probabilities with a counter-based RNG (Philox-4x32, 7 rounds, as in
// flash-attn 2.x), so the forward and the backward draw the same mask from (seed, offset) alone.
//
// The mask is a function of (sequence b, head h, query row i, key j) only, never of a kernel's
// tiles, so kernels with different tile shapes agree. The keys are cut into 16 x 32 chunks; one
// Philox call gives the 16 bytes of one chunk that one MMA lane holds:
//   counter = ((j / 32) << 5 | lane,  i / 16,  b * heads + h,  offset_lo),  key = seed (+ offset_hi)
//   lane = (i % 8) * 4 + (j % 8) / 2                 (the m16n8 accumulator lane of (i, j))
//   byte = ((j % 32) / 8) * 4 + ((i % 16) / 8) * 2 + j % 2
// and the entry is kept when that byte is below `threshold` = round((1 - p) * 256). Kept entries
// are scaled by 1 / (1 - p).
//
// The kernels apply it to their S-shaped accumulators ((2, 2), MMA_M, MMA_N) where each thread
// holds, for every MMA_M and every 4 consecutive MMA_N, one whole 16 x 32 chunk's 16 entries of one
// lane (the forward's warps stack along M; the backward's S / dP MMA gives each warp 32 whole key
// columns). tests/cpp checks that property of every tile; the GPU tests check the kernels' outputs
// and gradients against the reference applying dropout_mask (DropoutRng::keep, entry by entry).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDACC__)
#include <cute/tensor.hpp>
#endif

#include "block_info.h"  // FLASH_HOST_DEVICE
#include "params.h"

namespace flash_attn_cute {

struct PhiloxKey {
  uint32_t k0, k1;
};

struct Philox4 {
  uint32_t x, y, z, w;
};

// Philox-4x32 (Salmon et al., SC'11) with kRounds rounds; 10 is the reference, 7 what the kernels use.
template <int kRounds>
FLASH_HOST_DEVICE Philox4 philox(Philox4 ctr, PhiloxKey key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t p0 = uint64_t(kMul0) * ctr.x;
    const uint64_t p1 = uint64_t(kMul1) * ctr.z;
    ctr = {uint32_t(p1 >> 32) ^ ctr.y ^ key.k0, uint32_t(p1), uint32_t(p0 >> 32) ^ ctr.w ^ key.k1, uint32_t(p0)};
    key.k0 += kWeyl0;
    key.k1 += kWeyl1;
  }
  return ctr;
}

// One call's dropout: the RNG stream (seed, offset) and the keep threshold.
struct DropoutRng {
  PhiloxKey key;
  uint32_t offset_lo;
  uint32_t threshold;  // keep a byte < threshold (0..256)

  FLASH_HOST_DEVICE DropoutRng(uint64_t seed, uint64_t offset, uint32_t threshold_)
      : key{uint32_t(seed), uint32_t(seed >> 32) + uint32_t(offset >> 32)},
        offset_lo(uint32_t(offset)),
        threshold(threshold_) {}

  // The 16 bytes of the 16 x 32 chunk around (row, col) that (row, col)'s lane holds.
  FLASH_HOST_DEVICE Philox4 chunk_bytes(uint32_t bh, int row, int col) const {
    const uint32_t lane = uint32_t(row % 8) * 4 + uint32_t(col % 8) / 2;
    return philox<7>({(uint32_t(col) / 32) << 5 | lane, uint32_t(row) / 16, bh, offset_lo}, key);
  }

  FLASH_HOST_DEVICE bool keep_byte(uint32_t word, int byte) const { return ((word >> (8 * byte)) & 0xFFu) < threshold; }

  // Whether entry (row, col) of head bh = b * heads + h is kept (the definition; kernels use apply).
  FLASH_HOST_DEVICE bool keep(uint32_t bh, int row, int col) const {
    const Philox4 r = chunk_bytes(bh, row, col);
    const int word = (col % 32) / 8;
    const uint32_t w = word == 0 ? r.x : word == 1 ? r.y : word == 2 ? r.z : r.w;
    return keep_byte(w, ((row % 16) / 8) * 2 + col % 2);
  }
};

// keep a byte below this: round((1 - p) * 256), so the kept fraction is within 1 / 512 of 1 - p.
FLASH_HOST_DEVICE uint32_t dropout_threshold(float p) {
  const float t = (1.f - p) * 256.f + 0.5f;
  return t <= 0.f ? 0u : t >= 256.f ? 256u : uint32_t(t);
}

// The (seed, offset) of this call: from device memory when the caller gave pointers (a CUDA graph
// capture, or the backward reading the forward's rng_state), else the values.
struct SeedOffset {
  uint64_t seed, offset;
};
FLASH_HOST_DEVICE SeedOffset dropout_seed_offset(DropoutParams const& d) {
  return {d.seed_ptr ? uint64_t(*d.seed_ptr) : d.seed, d.offset_ptr ? uint64_t(*d.offset_ptr) + d.offset_extra : d.offset};
}

#if defined(__CUDACC__)
// The first thread of the grid stores the (seed, offset) this call drew in d.rng_state, for the
// backward (a CUDA graph replay draws new ones).
__device__ __forceinline__ void record_rng_state(DropoutParams const& d) {
  if (d.rng_state && threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
    const SeedOffset so = dropout_seed_offset(d);
    d.rng_state[0] = int64_t(so.seed);
    d.rng_state[1] = int64_t(so.offset);
  }
}
#endif

// On the device, every thread of a warp must call it (it shuffles).
FLASH_HOST_DEVICE DropoutRng make_dropout_rng(DropoutParams const& d) {
  const SeedOffset so = dropout_seed_offset(d);
  DropoutRng rng(so.seed, so.offset, dropout_threshold(d.p));
#if defined(__CUDA_ARCH__)
  // The same values in every thread, but read from device memory when captured in a graph: taken
  // from lane 0, they are known to be warp-uniform, so the compiler keeps the key schedule (the
  // key plus each round's constants) in uniform registers instead of adding it up in every thread
  // for every Philox call (27 instructions fewer per step of the Hopper forward at hdim 128).
  rng.key = {__shfl_sync(0xffffffffu, rng.key.k0, 0), __shfl_sync(0xffffffffu, rng.key.k1, 0)};
  rng.offset_lo = __shfl_sync(0xffffffffu, rng.offset_lo, 0);
#endif
  return rng;
}

#if defined(__CUDACC__)
// prmt.b32 (default mode) of x and 0: selector nibble i picks result byte i from x's bytes 0..3
// (4..7 are zero); a nibble's bit 3 replicates the picked byte's sign bit instead.
__device__ __forceinline__ uint32_t byte_perm(uint32_t x, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(0u), "r"(selector));
  return r;
}
#endif

// The keep mask itself, for tests and return_attn_probs: out[((b * heads + h) * seqlen_q + i) *
// seqlen_k + j] = entry (i, j) of sequence b, head h is kept (false past the sequence's lengths).
struct DropoutMaskParams {
  DropoutParams dropout;
  bool* out = nullptr;
  int batch = 0, heads = 0, seqlen_q = 0, seqlen_k = 0;  // max lengths in varlen mode
  const int* cu_seqlens_q = nullptr;                     // varlen: int32 (batch + 1,) each, else nullptr
  const int* cu_seqlens_k = nullptr;
};
cudaError_t run_dropout_mask(DropoutMaskParams const& params, cudaStream_t stream);  // csrc/dropout_mask.cu

#if defined(__CUDACC__)
// The Philox words of one ((2, 2), MMA_M, MMA_N) S fragment: a chunk's four words per MMA_M and
// every 4 consecutive MMA_N, word nn's byte v deciding entry v of block (m, 4 * chunk + nn). They
// depend on the coordinates alone, so a kernel can draw them while its MMAs run.
template <int kMmaM, int kMmaN>
struct DropoutWords {
  static_assert(kMmaN % 4 == 0, "dropout takes 32 key columns per lane at a time");
  Philox4 chunk[kMmaM][kMmaN / 4];

  __device__ __forceinline__ uint32_t word(int m, int n) const {
    const Philox4& r = chunk[m][n / 4];
    return n % 4 == 0 ? r.x : n % 4 == 1 ? r.y : n % 4 == 2 ? r.z : r.w;
  }
};

// The words of this thread's S fragment, whose (row, col) in the tile tScS gives; the tile starts
// at (row0, col0) of head bh.
template <class Coords>
__device__ __forceinline__ auto draw_dropout_words(DropoutRng const& rng, Coords const& tScS, uint32_t bh, int row0,
                                                   int col0) {
  constexpr int kMmaM = decltype(cute::size<1>(tScS))::value;
  constexpr int kMmaN = decltype(cute::size<2>(tScS))::value;
  DropoutWords<kMmaM, kMmaN> words;
#pragma unroll
  for (int m = 0; m < kMmaM; ++m) {
#pragma unroll
    for (int g = 0; g < kMmaN / 4; ++g) {
      const auto rc = tScS(0, m, 4 * g);
      words.chunk[m][g] = rng.chunk_bytes(bh, row0 + int(cute::get<0>(rc)), col0 + int(cute::get<1>(rc)));
    }
  }
  return words;
}

// The words drawn ahead of a warpgroup MMA wait, and nothing (an int) without dropout. ptxas
// hoists the wait to the top of its basic block, which would put the draws after it: a branch on
// every word ends the block here. It is taken with probability 2^-32, and then only sleeps 0 ns.
template <bool Is_dropout, class Coords>
__device__ __forceinline__ auto draw_dropout_words_before_wait(DropoutRng const& rng, Coords const& tScS, uint32_t bh,
                                                               int row0, int col0) {
  if constexpr (Is_dropout) {
    const auto words = draw_dropout_words(rng, tScS, bh, row0, col0);
    uint32_t all = 0;
#pragma unroll
    for (auto const& row : words.chunk) {
#pragma unroll
      for (Philox4 const& r : row) all ^= r.x ^ r.y ^ r.z ^ r.w;
    }
    if (all == 0x9E3779B9u) asm volatile("nanosleep.u32 0;");
    return words;
  } else {
    return 0;
  }
}

// Calls word_fn(m, n, word) for every (MMA_M, MMA_N) block of the fragment: byte v of word decides
// entry v of the block.
template <int kMmaM, int kMmaN, class Fn>
__device__ __forceinline__ void for_each_dropout_word(DropoutWords<kMmaM, kMmaN> const& words, Fn&& word_fn) {
#pragma unroll
  for (int m = 0; m < kMmaM; ++m) {
#pragma unroll
    for (int n = 0; n < kMmaN; ++n) word_fn(m, n, words.word(m, n));
  }
}

// Bytes 2h and 2h + 1 of a word as two 16-bit lanes, each 0xFFFF where its entry is kept (the byte
// is below the threshold), else 0. Widened to 16 bits, a byte and the threshold (up to 256) are
// fp16 zeros or positive subnormals, which compare as the integers do (set without .ftz).
__device__ __forceinline__ uint32_t kept_lanes(uint32_t word, int h, uint32_t threshold) {
  uint32_t lanes;
  asm("set.lt.u32.f16x2 %0, %1, %2;" : "=r"(lanes) : "r"(byte_perm(word, h == 0 ? 0x4140u : 0x4342u)),
      "r"(threshold * 0x10001u));
  return lanes;
}

// Forward: the dropped entries of P (16-bit elements, the S fragment's layout) become 0; the row
// sums already hold them, and O is scaled by 1 / (1 - p) at the end. Entries v = 0, 1 of a block
// share one 32-bit register, as do v = 2, 3: each register is masked by its two lanes.
template <class Frag, class Words>
__device__ __forceinline__ void zero_dropped(Frag& x, Words const& words, uint32_t threshold) {
  static_assert(sizeof(typename Frag::value_type) == 2);
  static_assert(decltype(cute::stride<0, 0>(x.layout()))::value == 1 &&
                decltype(cute::stride<0, 1>(x.layout()))::value == 2);
  for_each_dropout_word(words, [&](int m, int n, uint32_t word) {
    uint32_t* pairs = reinterpret_cast<uint32_t*>(&x(0, m, n));
#pragma unroll
    for (int h = 0; h < 2; ++h) pairs[h] &= kept_lanes(word, h, threshold);
  });
}

// zero_dropped with the words drawn here, for the fragment whose coordinates tScS gives.
template <class Frag, class Coords>
__device__ __forceinline__ void zero_dropped(Frag& x, DropoutRng const& rng, Coords const& tScS, uint32_t bh, int row0,
                                             int col0) {
  zero_dropped(x, draw_dropout_words(rng, tScS, bh, row0, col0), rng.threshold);
}

// Bytes 2h and 2h + 1 of a word widened to 16-bit lanes, plus 0x8000 - threshold each: a lane's bit
// 15 is set exactly when its byte is >= threshold (dropped), with no carry between the lanes. The
// backward's form: its constant stays in a uniform register, where kept_lanes' threshold takes a
// register of every thread, and the backward's step spilled with it (session 33).
__device__ __forceinline__ uint32_t dropped_lanes(uint32_t word, int h, uint32_t threshold) {
  return byte_perm(word, h == 0 ? 0x4140u : 0x4342u) + (0x8000u - threshold) * 0x10001u;
}

// Backward: P = -P at the dropped entries of an fp32 fragment of S's shape ((2, 2), MMA_M, MMA_N).
// The sign carries the mask past the dP GEMM, with no register: dscores<true> then forms
// dS = max(P, 0) dP - |P| D, and max(P, 0) is the P * keep that dV takes (relu_pairs).
// prmt's sign mode spreads a lane's bit 15 over a whole word, of which P takes the sign bit.
template <class Frag, class Words>
__device__ __forceinline__ void negate_dropped(Frag& x, Words const& words, uint32_t threshold) {
  static_assert(sizeof(typename Frag::value_type) == 4);
  for_each_dropout_word(words, [&](int m, int n, uint32_t word) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t lanes = dropped_lanes(word, h, threshold);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = x(2 * h + e, m, n);
        v = __uint_as_float(__float_as_uint(v) ^ (byte_perm(lanes, e == 0 ? 0x9999u : 0xBBBBu) & 0x80000000u));
      }
    }
  });
}

// negate_dropped with the words drawn here, for the fragment whose coordinates tScS gives.
template <class Frag, class Coords>
__device__ __forceinline__ void negate_dropped(Frag& x, DropoutRng const& rng, Coords const& tScS, uint32_t bh,
                                               int row0, int col0) {
  negate_dropped(x, draw_dropout_words(rng, tScS, bh, row0, col0), rng.threshold);
}

// x = max(x, 0) over a fragment of 16-bit floats, two at a time (the backward's P * keep for dV).
template <class Frag>
__device__ __forceinline__ void relu_pairs(Frag& x) {
  using T = typename Frag::value_type;
  static_assert(sizeof(T) == 2 && cute::size(Frag{}) % 2 == 0);
  uint32_t* pairs = reinterpret_cast<uint32_t*>(x.data());
#pragma unroll
  for (int i = 0; i < cute::size(x) / 2; ++i) {
    if constexpr (std::is_same_v<T, cutlass::bfloat16_t>) {
      asm("max.bf16x2 %0, %1, %2;" : "=r"(pairs[i]) : "r"(pairs[i]), "r"(0u));
    } else {
      asm("max.f16x2 %0, %1, %2;" : "=r"(pairs[i]) : "r"(pairs[i]), "r"(0u));
    }
  }
}
#endif

}  // namespace flash_attn_cute
