// Kernel launchers of the CUDA ops: plain pointers and sizes, no torch headers, so that nvcc
// compiles kernels.cu in seconds. Argument checks and allocation live in ops_cuda.cpp.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "actbench/quant_math.h"

namespace actbench {

cudaError_t launch_group_minmax(int dtype, const void* x, Groups gr, float* mn, float* mx, cudaStream_t stream);

cudaError_t launch_quantize(int dtype, const void* x, Groups gr, const float* mn, const float* mx,
                            SampleLayout layout, int64_t total_bytes, uint64_t seed, uint64_t offset,
                            uint8_t* codes, uint16_t* lo, uint16_t* scale, cudaStream_t stream);

cudaError_t launch_dequantize(int dtype, const uint8_t* codes, const uint16_t* lo, const uint16_t* scale, Groups gr,
                              SampleLayout layout, int64_t total_bytes, void* out, cudaStream_t stream);

// code: -1 for a bool mask, else the dtype code of a float tensor read as value > 0.
cudaError_t launch_pack_mask(int code, const void* mask, int64_t numel, uint8_t* out, cudaStream_t stream);
cudaError_t launch_unpack_mask(const uint8_t* packed, int64_t numel, bool* out, cudaStream_t stream);
cudaError_t launch_apply_mask(int dtype, const void* grad, const uint8_t* packed, int64_t numel, float scale,
                              void* out, cudaStream_t stream);

cudaError_t launch_max_pool2d(int dtype, const void* x, int64_t planes, Pool2d p, void* out, int8_t* argmax,
                              cudaStream_t stream);
cudaError_t launch_max_pool2d_backward(int dtype, const void* grad_out, const int8_t* argmax, int64_t planes,
                                       Pool2d p, void* grad_in, cudaStream_t stream);

}  // namespace actbench
