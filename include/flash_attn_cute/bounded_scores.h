// bf16 softcap's fixed exponent offset (softmax.h, fwd_mainloop.h). Host-and-device, no CuTe: the
// glue decides with it which calls need the redo list (FwdParams::redo_tiles).
#pragma once

#include <cmath>

#include "block_info.h"

namespace flash_attn_cute {

// Softcap's scores are tanh values, in [-1, 1] (or -inf where hidden), so the exponent's offset
// needs no running max: with scale_log2 = cap * log2(e) up to kMaxScaleLog2 and the offset
// offset_log2(scale_log2), every term exp2(t * scale_log2 - offset) lies in [2^kLeastLog2,
// 2^kMostLog2]. At the top, O's sums of n terms times V stay finite for n and |V| up to 2^24; at the
// bottom, a term times a V entry down to 2^-40 stays a normal float. Only where P is bf16 (fp32's
// exponent range): fp16 tops out at 2^16 and loses bits from 2^-14 down. With ALiBi a score is t + b,
// its bias b at most the row's largest one, b_max (FwdMask::alibi_max_bias), which some key of the
// row carries: offset + b_max * scale_log2 bounds every term from above as before, and that key's
// term from below, so the row's sum stays a normal float; terms far below it may flush to 0.
// A larger cap keeps the bound from above; the one from below then holds for a row whose largest
// term reaches 2^kLeastLog2, that is whose largest tanh value t reaches 1 - 166 / scale_log2. Up to
// a cap of 100 (kMaxListedScaleLog2: a row's largest logit at -15 or more) the fixed-offset kernel
// runs anyway and lists the tiles where a row's sum shows that it may not hold (Softmax::sums_reach),
// which the checked kernel then redoes; larger caps take the checked kernel alone, which starts each
// tile with the running max and moves to the fixed offset once every row's running max shows it
// (Softmax::offsets_reach).
struct BoundedScores {
  static constexpr float kMostLog2 = 80.f;
  static constexpr float kLeastLog2 = -86.f;
  static constexpr float kLeastTerm = 0x1p-86f;  // 2^kLeastLog2
  static constexpr float kMaxScaleLog2 = (kMostLog2 - kLeastLog2) / 2.f;  // a cap of 57.5
  static constexpr float kMaxListedScaleLog2 = 144.3f;                   // a cap of 100
  static FLASH_HOST_DEVICE bool fits(float scale_log2) { return scale_log2 <= kMaxScaleLog2; }
  // A cap past fits whose calls take the listing and redo passes (FwdParams::redo_tiles).
  static FLASH_HOST_DEVICE bool listed(float scale_log2) {
    return !fits(scale_log2) && scale_log2 <= kMaxListedScaleLog2;
  }
  static FLASH_HOST_DEVICE float offset_log2(float scale_log2) { return fmaxf(0.f, scale_log2 - kMostLog2); }
};

}  // namespace flash_attn_cute
