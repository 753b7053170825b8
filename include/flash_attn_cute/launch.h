// Programmatic dependent launch (sm_90): a kernel launched with launch_dependent() may start while
// the kernel before it in the stream finishes, and waits for that kernel's memory with
// wait_for_prior_grid() before it reads its output. The earlier kernel lets it start once every one
// of its CTAs has called allow_dependent_launch(). On older devices both calls are no-ops and the
// launch is an ordinary one.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

namespace flash_attn_cute {

// Dynamic shared memory a launch gets without raising the kernel's limit
// (cudaFuncAttributeMaxDynamicSharedMemorySize).
inline constexpr int kDefaultMaxDynamicSmemBytes = 48 * 1024;

// Lets `kernel` take smem_bytes of dynamic shared memory on `device`, or returns
// cudaErrorLaunchOutOfResources where the device allows less per block (sm_86 / sm_89: 99 KB),
// which the torch glue (check_launch) reports as such instead of a failed launch.
template <class Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, int smem_bytes, int device) {
  if (smem_bytes < kDefaultMaxDynamicSmemBytes) return cudaSuccess;
  int smem_optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  if (smem_bytes > smem_optin) return cudaErrorLaunchOutOfResources;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
}

// Whether a kernel's body is compiled for the arch of this device pass: the small tiles (GPUs with
// less shared memory a block, tile_size.h) serve GPUs below sm_90 only, unless the build has them
// for every arch (csrc/features.py); elsewhere their kernels trap.
template <bool kSmallSmem>
__host__ __device__ constexpr bool small_smem_kernel_built() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(FLASH_ATTN_CUTE_SMALL_SMEM_EVERY_ARCH)
  return !kSmallSmem;
#else
  return true;
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The binary version (major * 10 + minor) of the code `kernel` runs on the current device, whose
// griddepcontrol instructions exist from 90 on. Cached per kernel and device: cudaFuncGetAttributes
// took 3-5 us of a launch's host time.
inline cudaError_t kernel_binary_version(void const* kernel, int& version) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  static std::mutex mutex;
  static std::map<std::pair<void const*, int>, int> versions;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = versions.find({kernel, device});
  if (it == versions.end()) {
    cudaFuncAttributes attributes;
    err = cudaFuncGetAttributes(&attributes, kernel);
    if (err != cudaSuccess) return err;
    it = versions.emplace(std::make_pair(kernel, device), attributes.binaryVersion).first;
  }
  version = it->second;
  return cudaSuccess;
}

template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                             Args const&... args) {
  int binary_version = 0;
  cudaError_t err = kernel_binary_version(reinterpret_cast<void const*>(kernel), binary_version);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = binary_version >= 90 ? 1 : 0;
  err = cudaLaunchKernelEx(&config, kernel, args...);
  return err != cudaSuccess ? err : cudaPeekAtLastError();
}

}  // namespace flash_attn_cute
