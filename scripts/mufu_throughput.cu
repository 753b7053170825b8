// Throughput of the MUFU unit's ex2 / tanh / rcp, and of softcap-like softmax steps with the
// kernels' own tanh (mask.h's fast_tanh) and FMA exponential (softmax.h's exp2_fma), on the GPU it
// runs on (no torch). Each thread keeps 8 independent chains, 4 CTAs of 512 threads per SM.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I include -I <CUTLASS include> \
//     -o mufu_throughput scripts/mufu_throughput.cu   (CUTLASS: csrc/features.py find_cutlass_include)
//   ./mufu_throughput   (results: benchmarks/results/2026-12-06_h100_session54.md)
#include <cstdio>
#include <cuda_runtime.h>

#include "flash_attn_cute/softmax.h"

using flash_attn_cute::exp2_fma;
using flash_attn_cute::fast_tanh;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp(float x) {
  float y;
  asm volatile("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// tanh x = 1 - 2 / (1 + 2^(2 x log2 e)) with the 2^ on the FMA pipe: one MUFU operation (rcp).
__device__ __forceinline__ float tanh_rcp(float x) {
  const float e = exp2_fma(fminf(x, 40.f) * 2.8853900817779268f);
  return fmaf(-2.f, rcp(1.f + e), 1.f);
}

enum class Op { kEx2, kTanh, kRcp, kSoftcapStep, kSoftcapStepRcpHalf, kSoftcapStepRcpQuarter, kPlainStep };

// The steps: a score's tanh (or none: kPlainStep), then its exponential, every 4th on the FMA pipe
// as the hdim 64 softcap kernels do (none in kPlainStep), summed per row.
template <Op kOp>
__global__ void chains(float* out, int iters, float s) {
  float v[8], sum[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    v[j] = threadIdx.x * 1e-4f + j * 1e-3f;
    sum[j] = 0.f;
  }
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (kOp == Op::kEx2) v[j] = ex2(v[j]) * s;
      if constexpr (kOp == Op::kTanh) v[j] = fast_tanh(v[j]) * s;
      if constexpr (kOp == Op::kRcp) v[j] = rcp(v[j]) * s;
      if constexpr (kOp >= Op::kSoftcapStep) {
        const float x = v[j] * s + 0.25f;
        float t;
        if (kOp == Op::kSoftcapStepRcpHalf && (j & 1)) t = tanh_rcp(x);
        else if (kOp == Op::kSoftcapStepRcpQuarter && (j & 3) == 3) t = tanh_rcp(x);
        else if (kOp == Op::kPlainStep) t = x;
        else t = fast_tanh(x);
        const float y = fmaf(t, 1.4427f, -1.f);
        const float p = (j & 3) == 3 && kOp != Op::kPlainStep ? exp2_fma(y) : ex2(y);
        sum[j] += p;
        v[j] = x + p * 1e-7f;
      }
    }
  }
  float a = 0.f;
  for (int j = 0; j < 8; ++j) a += v[j] + sum[j];
  if (a == 12345.f) out[0] = a;  // keeps the chains live
}

template <Op kOp>
void measure(const char* name, float* out, int sms) {
  constexpr int kIters = 4096, kReps = 5, kCtasPerSm = 4, kThreads = 512;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  chains<kOp><<<sms * kCtasPerSm, kThreads>>>(out, kIters, 0.5f);
  cudaEventRecord(start);
  for (int r = 0; r < kReps; ++r) chains<kOp><<<sms * kCtasPerSm, kThreads>>>(out, kIters, 0.5f);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms;
  cudaEventElapsedTime(&ms, start, stop);
  const double elements_per_sm = double(kReps) * kCtasPerSm * kThreads * kIters * 8;
  printf("%-24s %8.3f ms  %.3f ns per 1000 elements per SM\n", name, ms, ms * 1e9 / elements_per_sm);
}

int main() {
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out;
  cudaMalloc(&out, sizeof(float));
  for (int round = 0; round < 2; ++round) {
    measure<Op::kEx2>("ex2", out, sms);
    measure<Op::kTanh>("tanh", out, sms);
    measure<Op::kRcp>("rcp", out, sms);
    measure<Op::kSoftcapStep>("step tanh + ex2", out, sms);
    measure<Op::kSoftcapStepRcpHalf>("step tanh_rcp 1/2", out, sms);
    measure<Op::kSoftcapStepRcpQuarter>("step tanh_rcp 1/4", out, sms);
    measure<Op::kPlainStep>("step ex2 only", out, sms);
  }
  const cudaError_t err = cudaGetLastError();
  printf("%s\n", cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
