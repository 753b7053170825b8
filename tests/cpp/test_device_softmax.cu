// Device unit test of Softmax::softmax_rescale_o / finalize on one warp's 16 x 32 score tiles:
// a first tile (Is_first), a later tile rescaling a given O, then finalize; compared on the host
// with a double-precision model of the same steps. Rows entirely -inf (Check_inf) included. With
// kLazyRescale the second tile moves the offset only when some row's max grows by more than
// kRescaleLog2 (in log2 units): cases where no row does, where one row does, and where a row sees
// its first key; without it, the offset is the exact running max.
// Prints "N passed, M failed" last; exit code 1 on failure.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "flash_attn_cute/softmax.h"

using namespace cute;
using namespace flash_attn_cute;

constexpr int kRows = 16, kCols = 32, kDim = 16;
using TiledMma = TiledMMA<MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>, Layout<Shape<_1, _1, _1>>, Tile<_16, _16, _16>>;

// s1, s2: (kRows, kCols) scores; o_in: O accumulated before the second tile; out: P1, P2, O, LSE.
template <bool kLazyRescale>
__global__ void softmax_tiles(float const* s1, float const* s2, float const* o_in, float scale_log2, float scale,
                              float* p1, float* p2, float* o_out, float* lse_out) {
  TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(threadIdx.x);
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kCols>>{}));  // (MMA, MMA_M, MMA_N)
  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kDim>>{}));   // (MMA, MMA_M, MMA_K)
  Tensor tSrS = partition_fragment_C(tiled_mma, Shape<Int<kRows>, Int<kCols>>{});           // (MMA, MMA_M, MMA_N)
  Tensor tOrO = partition_fragment_C(tiled_mma, Shape<Int<kRows>, Int<kDim>>{});            // (MMA, MMA_M, MMA_K)
  Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));
  Tensor tOrO_rc = make_tensor(tOrO.data(), acc_layout_rowcol(tOrO.layout()));
  auto at = [](auto const& c, int ld) { return get<0>(c) * ld + get<1>(c); };
  Softmax<2, kLazyRescale> softmax;

  for (int i = 0; i < size(tSrS); ++i) tSrS(i) = s1[at(tScS(i), kCols)];
  clear(tOrO);
  softmax.template softmax_rescale_o</*Is_first=*/true, /*Check_inf=*/true>(tSrS_rc, tOrO_rc, scale_log2);
  for (int i = 0; i < size(tSrS); ++i) p1[at(tScS(i), kCols)] = tSrS(i);

  for (int i = 0; i < size(tSrS); ++i) tSrS(i) = s2[at(tScS(i), kCols)];
  for (int i = 0; i < size(tOrO); ++i) tOrO(i) = o_in[at(tOcO(i), kDim)];
  softmax.template softmax_rescale_o</*Is_first=*/false, /*Check_inf=*/true>(tSrS_rc, tOrO_rc, scale_log2);
  for (int i = 0; i < size(tSrS); ++i) p2[at(tScS(i), kCols)] = tSrS(i);

  auto lse = softmax.finalize(tOrO_rc, scale);
  for (int i = 0; i < size(tOrO); ++i) o_out[at(tOcO(i), kDim)] = tOrO(i);
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_layout_rowcol(tOcO.layout()));
  for (int mi = 0; mi < size(lse); ++mi) lse_out[get<0>(tOcO_rc(mi, 0))] = lse(mi);
}

int g_passed = 0, g_failed = 0;

// Runs the two tiles on the device and checks P1, P2, O and LSE against the model (counted in
// g_passed / g_failed). The lazy model moves the second tile's offset only if some row grows past
// kRescaleLog2 (want_rescale: whether the case makes one), the eager one always.
void run_case(std::string const& name, bool lazy, std::vector<float> const& s1, std::vector<float> const& s2,
              std::vector<float> const& o_in, float scale, bool want_rescale) {
  const float scale_log2 = scale * float(M_LOG2E);
  float *d_s1, *d_s2, *d_o_in, *d_p1, *d_p2, *d_o, *d_lse;
  const size_t s_bytes = s1.size() * sizeof(float), o_bytes = o_in.size() * sizeof(float);
  cudaMalloc(&d_s1, s_bytes); cudaMalloc(&d_s2, s_bytes); cudaMalloc(&d_p1, s_bytes); cudaMalloc(&d_p2, s_bytes);
  cudaMalloc(&d_o_in, o_bytes); cudaMalloc(&d_o, o_bytes); cudaMalloc(&d_lse, kRows * sizeof(float));
  cudaMemcpy(d_s1, s1.data(), s_bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(d_s2, s2.data(), s_bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(d_o_in, o_in.data(), o_bytes, cudaMemcpyHostToDevice);
  (lazy ? softmax_tiles<true> : softmax_tiles<false>)<<<1, 32>>>(d_s1, d_s2, d_o_in, scale_log2, scale, d_p1, d_p2,
                                                                 d_o, d_lse);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("%s: kernel failed: %s\n", name.c_str(), cudaGetErrorString(err));
    ++g_failed;
    return;
  }
  std::vector<float> p1(s1.size()), p2(s1.size()), o(o_in.size()), lse(kRows);
  cudaMemcpy(p1.data(), d_p1, s_bytes, cudaMemcpyDeviceToHost);
  cudaMemcpy(p2.data(), d_p2, s_bytes, cudaMemcpyDeviceToHost);
  cudaMemcpy(o.data(), d_o, o_bytes, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), d_lse, kRows * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(d_s1); cudaFree(d_s2); cudaFree(d_p1); cudaFree(d_p2); cudaFree(d_o_in); cudaFree(d_o); cudaFree(d_lse);

  int passed = 0, failed = 0;
  auto check = [&](bool ok, char const* what, int row, int col, double got, double want) {
    if (ok) return ++passed, void();
    if (++failed <= 20) {
      std::printf("FAIL %s: %s row %d col %d: got %.7g want %.7g\n", name.c_str(), what, row, col, got, want);
    }
  };
  auto close = [](double got, double want) {
    return std::isinf(want) ? got == want : std::fabs(got - want) <= 1e-5 + 1e-5 * std::fabs(want);
  };
  std::vector<double> m1(kRows, -INFINITY), m2(kRows);
  bool rescale = false;
  for (int r = 0; r < kRows; ++r) {
    double tile2 = -INFINITY;
    for (int c = 0; c < kCols; ++c) {
      m1[r] = std::fmax(m1[r], s1[r * kCols + c]);
      tile2 = std::fmax(tile2, s2[r * kCols + c]);
    }
    m2[r] = std::fmax(m1[r], tile2);
    rescale |= tile2 * scale_log2 > m1[r] * scale_log2 + kRescaleLog2;
  }
  if (lazy) {
    check(rescale == want_rescale, "the case's rescale", -1, -1, rescale, want_rescale);
  } else {
    rescale = true;
  }
  for (int r = 0; r < kRows; ++r) {
    const double off1 = std::isinf(m1[r]) ? 0 : m1[r];  // Check_inf
    const double off2 = rescale ? (std::isinf(m2[r]) ? 0 : m2[r]) : off1;
    const double corr = !rescale ? 1 : std::isinf(m1[r]) ? 0 : std::exp((m1[r] - off2) * scale);
    double sum = 0;
    for (int c = 0; c < kCols; ++c) {
      const double want1 = std::exp((s1[r * kCols + c] - off1) * scale);
      const double want2 = std::exp((s2[r * kCols + c] - off2) * scale);
      check(close(p1[r * kCols + c], want1), "P1", r, c, p1[r * kCols + c], want1);
      check(close(p2[r * kCols + c], want2), "P2", r, c, p2[r * kCols + c], want2);
      sum += want1 * corr + want2;
    }
    const bool empty = sum == 0;
    for (int d = 0; d < kDim; ++d) {
      const double want = empty ? 0 : o_in[r * kDim + d] * corr / sum;
      check(close(o[r * kDim + d], want), "O", r, d, o[r * kDim + d], want);
    }
    // The LSE does not depend on the offset: off2 * scale + log(sum) = m2 * scale + log(exact sum).
    const double want_lse = empty ? INFINITY : off2 * scale + std::log(sum);
    check(close(lse[r], want_lse), "LSE", r, 0, lse[r], want_lse);
  }
  std::printf("%s: %d passed, %d failed\n", name.c_str(), passed, failed);
  g_passed += passed;
  g_failed += failed;
}

int main() {
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal;
  const float scale = 0.125f;
  std::vector<float> s1(kRows * kCols), s2(kRows * kCols), o_in(kRows * kDim);
  for (auto& x : s1) x = 4 * normal(gen);
  for (auto& x : s2) x = 4 * normal(gen);
  for (auto& x : o_in) x = normal(gen);
  // Every case runs with the lazy rescale and without it ("eager": the offset is the exact max).
  auto run_both = [&](char const* name, std::vector<float> const& t1, std::vector<float> const& t2,
                      std::vector<float> const& o, bool want_rescale) {
    run_case(name, true, t1, t2, o, scale, want_rescale);
    run_case(std::string("eager, ") + name, false, t1, t2, o, scale, want_rescale);
  };
  // No row's max grows by 2^8 (44 raw units at this scale): the offset stays at the first tile's.
  run_both("no growth", s1, s2, o_in, false);
  // Row 11 grows by 2^11: the whole warp moves its offsets.
  std::vector<float> s2_grow = s2;
  for (int c = 0; c < kCols; ++c) s2_grow[11 * kCols + c] += 60.f;
  run_both("one row grows", s1, s2_grow, o_in, true);
  // Row 3: masked in both tiles (sees no key). Row 5: masked in the first tile only (its first key
  // moves the offsets). Row 7: masked in the second tile only. Row 9: partly masked in both.
  // O accumulates P V only, so a row that has seen no key has O = 0 (rows 3 and 5 after the first tile).
  std::vector<float> m1 = s1, m2 = s2, o_unseen = o_in;
  for (int c = 0; c < kCols; ++c) {
    m1[3 * kCols + c] = m2[3 * kCols + c] = -INFINITY;
    m1[5 * kCols + c] = -INFINITY;
    m2[7 * kCols + c] = -INFINITY;
    if (c % 3) m1[9 * kCols + c] = m2[9 * kCols + c] = -INFINITY;
  }
  for (int d = 0; d < kDim; ++d) o_unseen[3 * kDim + d] = o_unseen[5 * kDim + d] = 0.f;
  run_both("masked rows", m1, m2, o_unseen, true);
  // Row 3 masked in both tiles, row 7 in the second only: no offset moves.
  std::vector<float> n1 = s1, n2 = s2;
  for (int c = 0; c < kCols; ++c) n1[3 * kCols + c] = n2[3 * kCols + c] = n2[7 * kCols + c] = -INFINITY;
  run_both("masked, no growth", n1, n2, o_unseen, false);
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}
