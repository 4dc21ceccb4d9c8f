// CUDA kernels of the actbench ops. Each thread handles one 8-value chunk (or one output value)
// through the same __host__ __device__ functions the CPU loops call (quant_math.h), with 64-bit
// indices and grid-stride loops, so tensors over 2^31 values and batches over 65,535 work.
#include "launchers.h"

namespace actbench {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

inline unsigned blocks_for(int64_t work, int threads = kThreads) {
  int64_t b = (work + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// One warp per group; lanes stride through it (coalesced), then reduce with shuffles.
template <int D>
__global__ void group_minmax_kernel(const typename Format<D>::T* __restrict__ x, Groups gr, float* __restrict__ mn,
                                    float* __restrict__ mx) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = grid_threads() / 32;
  for (int64_t t = global_thread() / 32; t < gr.n * gr.g; t += warps) {
    int64_t n = t / gr.g, gi = t % gr.g;
    int64_t first = gi * gr.group_size;
    int64_t len = gr.per_sample - first < gr.group_size ? gr.per_sample - first : gr.group_size;
    const typename Format<D>::T* p = x + n * gr.per_sample + first;
    float a = bits_float(0x7F800000u), b = bits_float(0xFF800000u), bad = 0.0f;
    for (int64_t i = lane; i < len; i += 32) {
      float v = Format<D>::load(p[i]);
      a = v < a ? v : a;
      b = v > b ? v : b;
      bad += v * 0.0f;  // NaN exactly when some value is NaN or +-inf
    }
    bool any_bad = is_nan(bad);
    for (int s = 16; s > 0; s >>= 1) {
      float oa = __shfl_xor_sync(0xFFFFFFFFu, a, s), ob = __shfl_xor_sync(0xFFFFFFFFu, b, s);
      a = oa < a ? oa : a;
      b = ob > b ? ob : b;
    }
    any_bad = __any_sync(0xFFFFFFFFu, any_bad);
    if (lane == 0) {
      mn[t] = any_bad ? bits_float(0x7FC00000u) : a;
      mx[t] = any_bad ? bits_float(0x7FC00000u) : b;
    }
  }
}

// One warp per group, one pass: each lane takes the range of its chunks (8 values each), the warp
// reduces it with shuffles (unless mn/mx were given), and the lanes quantize the same chunks, now
// in cache. Min, max and the non-finite flag are order-independent, so the codes equal the CPU's.
template <int D>
__global__ void quantize_kernel(const typename Format<D>::T* __restrict__ x, Groups gr, const float* __restrict__ mn,
                                const float* __restrict__ mx, SampleLayout layout, int64_t total_bytes, uint64_t seed,
                                uint64_t offset, uint8_t* __restrict__ codes, uint16_t* __restrict__ lo,
                                uint16_t* __restrict__ scale) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = grid_threads() / 32, cps = gr.chunks_per_sample(), per_group = gr.group_size / 8;
  for (int64_t t = global_thread() / 32; t < gr.n * gr.g; t += warps) {
    const int64_t n = t / gr.g, gi = t % gr.g;
    const typename Format<D>::T* sample = x + n * gr.per_sample;
    float a, b;
    if (mn != nullptr) {
      a = mn[t];
      b = mx[t];
    } else {
      a = bits_float(0x7F800000u);
      b = bits_float(0xFF800000u);
      float bad = 0.0f;
      const int64_t first = gi * gr.group_size;
      const int64_t last = gr.per_sample < first + gr.group_size ? gr.per_sample : first + gr.group_size;
      for (int64_t i = first + lane * 8; i < last; i += 32 * 8) {
        for (int j = 0; j < 8 && i + j < last; ++j) {
          float v = Format<D>::load(sample[i + j]);
          a = v < a ? v : a;
          b = v > b ? v : b;
          bad += v * 0.0f;
        }
      }
      bool any_bad = is_nan(bad);
      for (int s = 16; s > 0; s >>= 1) {
        float oa = __shfl_xor_sync(0xFFFFFFFFu, a, s), ob = __shfl_xor_sync(0xFFFFFFFFu, b, s);
        a = oa < a ? oa : a;
        b = ob > b ? ob : b;
      }
      any_bad = __any_sync(0xFFFFFFFFu, any_bad);
      if (any_bad) a = b = bits_float(0x7FC00000u);
    }
    const int bits = layout.bits_of(n);
    const GroupParams p = group_params(a, b, bits);
    if (lane == 0) {
      lo[t] = p.lo_bits;
      scale[t] = p.scale_bits;
    }
    for (int64_t kk = lane; kk < per_group; kk += 32) {
      const int64_t k = gi * per_group + kk;
      const int64_t at = layout.start_of(n, cps) + k * bits;
      if (at + bits > total_bytes) continue;  // per-sample bits inconsistent with total_bits: never write out of bounds
      quantize_chunk<D>(sample, gr.per_sample, k, p, bits, static_cast<uint64_t>(n * cps + k), seed, offset,
                        codes + at);
    }
  }
}

template <int D>
__global__ void dequantize_kernel(const uint8_t* __restrict__ codes, const uint16_t* __restrict__ lo,
                                  const uint16_t* __restrict__ scale, Groups gr, SampleLayout layout,
                                  int64_t total_bytes, typename Format<D>::T* __restrict__ out) {
  const int64_t cps = gr.chunks_per_sample(), per_group = gr.group_size / 8;
  for (int64_t c = global_thread(); c < gr.n * cps; c += grid_threads()) {
    int64_t n = c / cps, k = c % cps, t = n * gr.g + k / per_group;
    int bits = layout.bits_of(n);
    int64_t at = layout.start_of(n, cps) + k * bits;
    if (at + bits > total_bytes) continue;
    dequantize_chunk<D>(codes + at, bits, bf16_to_float(lo[t]), bf16_to_float(scale[t]), gr.per_sample, k,
                        out + n * gr.per_sample);
  }
}

// One thread per packed byte: 8 values in (bool, or a float output read as value > 0), 1 byte out.
template <int D>
__global__ void pack_mask_kernel(const void* __restrict__ mask, int64_t numel, uint8_t* __restrict__ out) {
  for (int64_t i = global_thread(); i < (numel + 7) / 8; i += grid_threads()) {
    uint32_t byte = 0;
    for (int j = 0; j < 8; ++j) {
      int64_t idx = i * 8 + j;
      if (idx >= numel) break;
      uint32_t bit;
      if constexpr (D < 0) {
        bit = static_cast<const bool*>(mask)[idx] ? 1u : 0u;
      } else {
        bit = mask_bit(Format<D>::load(static_cast<const typename Format<D>::T*>(mask)[idx]));
      }
      byte |= bit << j;
    }
    out[i] = static_cast<uint8_t>(byte);
  }
}

// One thread per packed byte: 8 bools out.
__global__ void unpack_mask_kernel(const uint8_t* __restrict__ packed, int64_t numel, bool* __restrict__ out) {
  for (int64_t i = global_thread(); i < (numel + 7) / 8; i += grid_threads()) {
    const uint32_t byte = packed[i];
    for (int j = 0; j < 8 && i * 8 + j < numel; ++j) out[i * 8 + j] = (byte >> j) & 1u;
  }
}

// One thread per packed byte: 8 gradients in, 8 masked (and scaled) gradients out.
template <int D>
__global__ void apply_mask_kernel(const typename Format<D>::T* __restrict__ grad, const uint8_t* __restrict__ packed,
                                  int64_t numel, float s, typename Format<D>::T* __restrict__ out) {
  for (int64_t i = global_thread(); i < (numel + 7) / 8; i += grid_threads()) {
    const uint32_t byte = packed[i];
    for (int j = 0; j < 8 && i * 8 + j < numel; ++j) {
      out[i * 8 + j] = Format<D>::store(masked_value(Format<D>::load(grad[i * 8 + j]), (byte >> j) & 1u, s));
    }
  }
}

template <int D>
__global__ void max_pool2d_kernel(const typename Format<D>::T* __restrict__ x, int64_t planes, Pool2d p,
                                  typename Format<D>::T* __restrict__ out, int8_t* __restrict__ argmax) {
  const int64_t out_plane = p.out_h * p.out_w, in_plane = p.in_h * p.in_w;
  for (int64_t i = global_thread(); i < planes * out_plane; i += grid_threads()) {
    int64_t c = i / out_plane, r = i % out_plane;
    float best;
    const int64_t oh = r / p.out_w, ow = r % p.out_w;
    argmax[i] = window_inside(p, oh, ow) ? window_argmax_inside<Format<D>>(x + c * in_plane, p, oh, ow, &best)
                                         : window_argmax<Format<D>>(x + c * in_plane, p, oh, ow, &best);
    out[i] = Format<D>::store(best);
  }
}

template <int D>
__global__ void max_pool2d_backward_kernel(const typename Format<D>::T* __restrict__ grad, const int8_t* __restrict__ arg,
                                           int64_t planes, Pool2d p, typename Format<D>::T* __restrict__ gin) {
  const int64_t out_plane = p.out_h * p.out_w, in_plane = p.in_h * p.in_w;
  for (int64_t i = global_thread(); i < planes * in_plane; i += grid_threads()) {
    int64_t c = i / in_plane, r = i % in_plane;
    gin[i] = Format<D>::store(
        pool_input_grad<Format<D>>(grad + c * out_plane, arg + c * out_plane, p, r / p.in_w, r % p.in_w));
  }
}

// Runs `launch.template operator()<D>()` for the runtime dtype code; unknown codes fail loudly.
template <typename F>
cudaError_t by_dtype(int dtype, F&& launch) {
  switch (dtype) {
    case kF32: launch.template operator()<kF32>(); break;
    case kF16: launch.template operator()<kF16>(); break;
    case kBF16: launch.template operator()<kBF16>(); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_group_minmax(int dtype, const void* x, Groups gr, float* mn, float* mx, cudaStream_t stream) {
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    group_minmax_kernel<D><<<blocks_for(gr.n * gr.g * 32), kThreads, 0, stream>>>(static_cast<const T*>(x), gr, mn, mx);
  });
}

cudaError_t launch_quantize(int dtype, const void* x, Groups gr, const float* mn, const float* mx,
                            SampleLayout layout, int64_t total_bytes, uint64_t seed, uint64_t offset,
                            uint8_t* codes, uint16_t* lo, uint16_t* scale, cudaStream_t stream) {
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    quantize_kernel<D><<<blocks_for(gr.n * gr.g * 32), kThreads, 0, stream>>>(
        static_cast<const T*>(x), gr, mn, mx, layout, total_bytes, seed, offset, codes, lo, scale);
  });
}

cudaError_t launch_dequantize(int dtype, const uint8_t* codes, const uint16_t* lo, const uint16_t* scale, Groups gr,
                              SampleLayout layout, int64_t total_bytes, void* out, cudaStream_t stream) {
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    dequantize_kernel<D><<<blocks_for(gr.n * gr.chunks_per_sample()), kThreads, 0, stream>>>(
        codes, lo, scale, gr, layout, total_bytes, static_cast<T*>(out));
  });
}

cudaError_t launch_pack_mask(int code, const void* mask, int64_t numel, uint8_t* out, cudaStream_t stream) {
  const unsigned blocks = blocks_for((numel + 7) / 8);
  switch (code) {
    case -1: pack_mask_kernel<-1><<<blocks, kThreads, 0, stream>>>(mask, numel, out); break;
    case kF32: pack_mask_kernel<kF32><<<blocks, kThreads, 0, stream>>>(mask, numel, out); break;
    case kF16: pack_mask_kernel<kF16><<<blocks, kThreads, 0, stream>>>(mask, numel, out); break;
    case kBF16: pack_mask_kernel<kBF16><<<blocks, kThreads, 0, stream>>>(mask, numel, out); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_unpack_mask(const uint8_t* packed, int64_t numel, bool* out, cudaStream_t stream) {
  unpack_mask_kernel<<<blocks_for((numel + 7) / 8), kThreads, 0, stream>>>(packed, numel, out);
  return cudaGetLastError();
}

cudaError_t launch_apply_mask(int dtype, const void* grad, const uint8_t* packed, int64_t numel, float scale,
                              void* out, cudaStream_t stream) {
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    apply_mask_kernel<D><<<blocks_for((numel + 7) / 8), kThreads, 0, stream>>>(
        static_cast<const T*>(grad), packed, numel, scale, static_cast<T*>(out));
  });
}

cudaError_t launch_max_pool2d(int dtype, const void* x, int64_t planes, Pool2d p, void* out, int8_t* argmax,
                              cudaStream_t stream) {
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    max_pool2d_kernel<D><<<blocks_for(planes * p.out_h * p.out_w), kThreads, 0, stream>>>(
        static_cast<const T*>(x), planes, p, static_cast<T*>(out), argmax);
  });
}

cudaError_t launch_max_pool2d_backward(int dtype, const void* grad_out, const int8_t* argmax, int64_t planes,
                                       Pool2d p, void* grad_in, cudaStream_t stream) {
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    max_pool2d_backward_kernel<D><<<blocks_for(planes * p.in_h * p.in_w), kThreads, 0, stream>>>(
        static_cast<const T*>(grad_out), argmax, planes, p, static_cast<T*>(grad_in));
  });
}

}  // namespace actbench
