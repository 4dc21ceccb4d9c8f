// CUDA registrations: argument checks (shared with the CPU side), allocation, device guard,
// current stream, and a launch check after every kernel. No host synchronisation per call.
#include <ATen/core/Tensor.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <vector>

#include "actbench/checks.h"
#include "launchers.h"

namespace actbench {
namespace {

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, "actbench::", op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

std::tuple<at::Tensor, at::Tensor> group_minmax_cuda(const at::Tensor& x_in, int64_t group_size) {
  const char* op = "group_minmax";
  Groups gr = groups_of(x_in.sizes(), group_size, op);
  int code = dtype_code(x_in.scalar_type(), op, "x");
  c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = x_in.contiguous();
  auto opts = x.options().dtype(at::kFloat);
  at::Tensor mn = at::empty({gr.n, gr.g}, opts), mx = at::empty({gr.n, gr.g}, opts);
  check_launch(launch_group_minmax(code, x.data_ptr(), gr, mn.data_ptr<float>(), mx.data_ptr<float>(),
                                   c10::cuda::getCurrentCUDAStream()),
               op);
  return {mn, mx};
}

// starts[n] = chunks_per_sample * sum_{m<n} bits[m], computed on the device (no sync).
at::Tensor byte_starts(const at::Tensor& bits, const Groups& gr) {
  return at::cumsum(bits, 0, at::kLong).sub_(bits).mul_(gr.chunks_per_sample());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_impl(const char* op, const at::Tensor& x_in,
                                                             const at::Tensor& mn_in, const at::Tensor& mx_in,
                                                             SampleLayout layout, int64_t total_bits,
                                                             int64_t group_size, int64_t seed, int64_t offset) {
  Groups gr = groups_of(x_in.sizes(), group_size, op);
  int code = dtype_code(x_in.scalar_type(), op, "x");
  const bool fused = check_minmax(x_in, mn_in, mx_in, gr, op);
  c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = x_in.contiguous(), mn = mn_in.contiguous(), mx = mx_in.contiguous();
  const int64_t total_bytes = gr.chunks_per_sample() * total_bits;
  at::Tensor codes = at::empty({total_bytes}, x.options().dtype(at::kByte));
  at::Tensor lo = at::empty({gr.n, gr.g}, x.options().dtype(at::kBFloat16));
  at::Tensor scale = at::empty({gr.n, gr.g}, x.options().dtype(at::kBFloat16));
  const float* pmn = fused ? nullptr : mn.data_ptr<float>();
  const float* pmx = fused ? nullptr : mx.data_ptr<float>();
  check_launch(launch_quantize(code, x.data_ptr(), gr, pmn, pmx, layout,
                               total_bytes, static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                               codes.data_ptr<uint8_t>(), reinterpret_cast<uint16_t*>(lo.data_ptr()),
                               reinterpret_cast<uint16_t*>(scale.data_ptr()), c10::cuda::getCurrentCUDAStream()),
               op);
  return {codes, lo, scale};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_cuda(const at::Tensor& x, const at::Tensor& mn,
                                                             const at::Tensor& mx, int64_t bits, int64_t group_size,
                                                             int64_t seed, int64_t offset) {
  check_uniform_bits(bits, "quantize");
  SampleLayout layout{static_cast<int>(bits), nullptr, nullptr};
  int64_t n = x.dim() > 0 ? x.size(0) : 0;
  return quantize_impl("quantize", x, mn, mx, layout, bits * n, group_size, seed, offset);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_mixed_cuda(const at::Tensor& x, const at::Tensor& mn,
                                                                   const at::Tensor& mx, const at::Tensor& bits_in,
                                                                   int64_t total_bits, int64_t group_size,
                                                                   int64_t seed, int64_t offset) {
  const char* op = "quantize_mixed";
  Groups gr = groups_of(x.sizes(), group_size, op);
  check_mixed_bits(bits_in, gr, op);
  check_same_device(x, bits_in, op, "bits");
  TORCH_CHECK(total_bits >= gr.n && total_bits <= 8 * gr.n, "actbench::", op, ": total_bits must be in [", gr.n,
              ", ", 8 * gr.n, "] for ", gr.n, " samples, got ", total_bits);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor bits = bits_in.contiguous();
  at::Tensor starts = byte_starts(bits, gr);
  SampleLayout layout{0, bits.data_ptr<int32_t>(), starts.data_ptr<int64_t>()};
  return quantize_impl(op, x, mn, mx, layout, total_bits, group_size, seed, offset);
}

at::Tensor dequantize_impl(const char* op, const at::Tensor& codes_in, const at::Tensor& lo_in,
                           const at::Tensor& scale_in, SampleLayout layout, int64_t expected_bytes,
                           int64_t group_size, c10::IntArrayRef shape, at::ScalarType dtype) {
  Groups gr = groups_of(shape, group_size, op);
  int code = dtype_code(dtype, op, "dtype");
  check_packed(codes_in, lo_in, scale_in, gr, op);
  TORCH_CHECK(expected_bytes < 0 || codes_in.numel() == expected_bytes, "actbench::", op, ": codes must hold ",
              expected_bytes, " bytes for shape ", shape, ", got ", codes_in.numel());
  c10::cuda::CUDAGuard guard(codes_in.device());
  at::Tensor codes = codes_in.contiguous(), lo = lo_in.contiguous(), scale = scale_in.contiguous();
  at::Tensor out = at::empty(shape, codes.options().dtype(dtype));
  check_launch(launch_dequantize(code, codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(lo.data_ptr()),
                                 reinterpret_cast<const uint16_t*>(scale.data_ptr()), gr, layout, codes.numel(),
                                 out.data_ptr(), c10::cuda::getCurrentCUDAStream()),
               op);
  return out;
}

at::Tensor dequantize_cuda(const at::Tensor& codes, const at::Tensor& lo, const at::Tensor& scale, int64_t bits,
                           int64_t group_size, c10::SymIntArrayRef shape_sym, at::ScalarType dtype) {
  check_uniform_bits(bits, "dequantize");
  c10::IntArrayRef shape = C10_AS_INTARRAYREF_SLOW(shape_sym);
  Groups gr = groups_of(shape, group_size, "dequantize");
  SampleLayout layout{static_cast<int>(bits), nullptr, nullptr};
  return dequantize_impl("dequantize", codes, lo, scale, layout, gr.chunks_per_sample() * bits * gr.n, group_size,
                         shape, dtype);
}

at::Tensor dequantize_mixed_cuda(const at::Tensor& codes, const at::Tensor& lo, const at::Tensor& scale,
                                 const at::Tensor& bits_in, int64_t group_size, c10::SymIntArrayRef shape_sym,
                                 at::ScalarType dtype) {
  const char* op = "dequantize_mixed";
  c10::IntArrayRef shape = C10_AS_INTARRAYREF_SLOW(shape_sym);
  Groups gr = groups_of(shape, group_size, op);
  check_mixed_bits(bits_in, gr, op);
  check_same_device(codes, bits_in, op, "bits");
  c10::cuda::CUDAGuard guard(codes.device());
  at::Tensor bits = bits_in.contiguous();
  at::Tensor starts = byte_starts(bits, gr);
  SampleLayout layout{0, bits.data_ptr<int32_t>(), starts.data_ptr<int64_t>()};
  // The expected size needs sum(bits) on the host; the kernel bounds every read by codes.numel().
  return dequantize_impl(op, codes, lo, scale, layout, -1, group_size, shape, dtype);
}

at::Tensor pack_mask_cuda(const at::Tensor& mask_in) {
  const int code = mask_code(mask_in.scalar_type(), "pack_mask");
  c10::cuda::CUDAGuard guard(mask_in.device());
  at::Tensor mask = mask_in.contiguous();
  at::Tensor out = at::empty({(mask.numel() + 7) / 8}, mask.options().dtype(at::kByte));
  check_launch(launch_pack_mask(code, mask.data_ptr(), mask.numel(), out.data_ptr<uint8_t>(),
                                c10::cuda::getCurrentCUDAStream()),
               "pack_mask");
  return out;
}

at::Tensor unpack_mask_cuda(const at::Tensor& packed_in, c10::SymIntArrayRef shape_sym) {
  c10::IntArrayRef shape = C10_AS_INTARRAYREF_SLOW(shape_sym);
  const int64_t numel = check_unpack_mask(packed_in, shape, "unpack_mask");
  c10::cuda::CUDAGuard guard(packed_in.device());
  at::Tensor packed = packed_in.contiguous();
  at::Tensor out = at::empty(shape, packed.options().dtype(at::kBool));
  check_launch(launch_unpack_mask(packed.data_ptr<uint8_t>(), numel, out.data_ptr<bool>(),
                                  c10::cuda::getCurrentCUDAStream()),
               "unpack_mask");
  return out;
}

at::Tensor apply_mask_cuda(const at::Tensor& grad_in, const at::Tensor& packed_in, double scale) {
  const char* op = "apply_mask";
  const int code = dtype_code(grad_in.scalar_type(), op, "grad");
  const int64_t numel = check_unpack_mask(packed_in, grad_in.sizes(), op);
  check_same_device(grad_in, packed_in, op, "packed");
  c10::cuda::CUDAGuard guard(grad_in.device());
  at::Tensor grad = grad_in.contiguous(), packed = packed_in.contiguous();
  at::Tensor out = at::empty(grad.sizes(), grad.options());
  check_launch(launch_apply_mask(code, grad.data_ptr(), packed.data_ptr<uint8_t>(), numel, static_cast<float>(scale),
                                 out.data_ptr(), c10::cuda::getCurrentCUDAStream()),
               op);
  return out;
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_with_argmax_cuda(const at::Tensor& x_in, c10::IntArrayRef kernel,
                                                               c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                               c10::IntArrayRef dilation, bool ceil_mode) {
  const char* op = "max_pool2d_with_argmax";
  Pool2d p = pool_geometry(x_in.sizes(), kernel, stride, padding, dilation, ceil_mode, op);
  int code = dtype_code(x_in.scalar_type(), op, "x");
  c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = x_in.contiguous();
  std::vector<int64_t> shape = pool_output_shape(x.sizes(), p);
  at::Tensor out = at::empty(shape, x.options()), arg = at::empty(shape, x.options().dtype(at::kChar));
  int64_t planes = x.numel() / (p.in_h * p.in_w);
  check_launch(launch_max_pool2d(code, x.data_ptr(), planes, p, out.data_ptr(), arg.data_ptr<int8_t>(),
                                 c10::cuda::getCurrentCUDAStream()),
               op);
  return {out, arg};
}

at::Tensor max_pool2d_backward_cuda(const at::Tensor& grad_in, const at::Tensor& arg_in, c10::SymIntArrayRef in_sym,
                                    c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                                    c10::IntArrayRef dilation) {
  const char* op = "max_pool2d_backward";
  c10::IntArrayRef in_shape = C10_AS_INTARRAYREF_SLOW(in_sym);
  Pool2d p = pool_backward_geometry(grad_in, arg_in, in_shape, kernel, stride, padding, dilation, op);
  int code = dtype_code(grad_in.scalar_type(), op, "grad_out");
  c10::cuda::CUDAGuard guard(grad_in.device());
  at::Tensor grad = grad_in.contiguous(), arg = arg_in.contiguous();
  at::Tensor gin = at::empty(in_shape, grad.options());
  int64_t planes = gin.numel() / (p.in_h * p.in_w);
  check_launch(launch_max_pool2d_backward(code, grad.data_ptr(), arg.data_ptr<int8_t>(), planes, p, gin.data_ptr(),
                                          c10::cuda::getCurrentCUDAStream()),
               op);
  return gin;
}

}  // namespace

TORCH_LIBRARY_IMPL(actbench, CUDA, m) {
  m.impl("group_minmax", &group_minmax_cuda);
  m.impl("quantize", &quantize_cuda);
  m.impl("quantize_mixed", &quantize_mixed_cuda);
  m.impl("dequantize", &dequantize_cuda);
  m.impl("dequantize_mixed", &dequantize_mixed_cuda);
  m.impl("pack_mask", &pack_mask_cuda);
  m.impl("unpack_mask", &unpack_mask_cuda);
  m.impl("apply_mask", &apply_mask_cuda);
  m.impl("max_pool2d_with_argmax", &max_pool2d_with_argmax_cuda);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cuda);
}

}  // namespace actbench
