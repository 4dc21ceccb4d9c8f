// Argument checks and output shapes shared by the CPU and CUDA registrations (host only).
// Error text names the op, the argument, what was expected and what it got.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/Exception.h>

#include <vector>

#include "actbench/quant_math.h"

namespace actbench {

inline Groups groups_of(c10::IntArrayRef shape, int64_t group_size, const char* op) {
  TORCH_CHECK(!shape.empty(), "actbench::", op, ": x must have a batch dimension, got a 0-d tensor");
  TORCH_CHECK(group_size > 0 && group_size % 8 == 0, "actbench::", op,
              ": group_size must be a positive multiple of 8, got ", group_size);
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  TORCH_CHECK(numel > 0, "actbench::", op, ": x must be non-empty, got shape ", shape);
  Groups gr;
  gr.n = shape[0];
  gr.per_sample = numel / gr.n;
  gr.group_size = group_size;
  gr.g = (gr.per_sample + group_size - 1) / group_size;
  return gr;
}

inline int dtype_code(at::ScalarType t, const char* op, const char* arg) {
  switch (t) {
    case at::kFloat:
      return kF32;
    case at::kHalf:
      return kF16;
    case at::kBFloat16:
      return kBF16;
    default:
      TORCH_CHECK(false, "actbench::", op, ": ", arg, " must be float32, float16 or bfloat16, got ", t);
  }
}

inline void check_uniform_bits(int64_t bits, const char* op) {
  TORCH_CHECK(bits == 1 || bits == 2 || bits == 4 || bits == 8, "actbench::", op,
              ": bits must be 1, 2, 4 or 8, got ", bits);
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op, const char* name) {
  TORCH_CHECK(a.device() == b.device(), "actbench::", op, ": ", name, " must be on ", a.device(), ", got ",
              b.device());
}

// mn/mx: float32 [N, G] computed earlier, or both empty: the quantizer then takes each group's
// range in the same pass over x. Returns true for the latter (fused).
inline bool check_minmax(const at::Tensor& x, const at::Tensor& mn, const at::Tensor& mx, const Groups& gr,
                         const char* op) {
  if (mn.numel() == 0 && mx.numel() == 0 && mn.scalar_type() == at::kFloat && mx.scalar_type() == at::kFloat) {
    return true;
  }
  for (const at::Tensor* t : {&mn, &mx}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 2 && t->size(0) == gr.n && t->size(1) == gr.g,
                "actbench::", op, ": mn and mx must be float32 [", gr.n, ", ", gr.g, "] (or both empty), got ",
                t->scalar_type(), " ", t->sizes());
    check_same_device(x, *t, op, "mn/mx");
  }
  return false;
}

// Code of a mask input: bool masks as they are, float outputs as value > 0 (a ReLU's output).
inline int mask_code(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kBool:
      return -1;
    case at::kFloat:
      return kF32;
    case at::kHalf:
      return kF16;
    case at::kBFloat16:
      return kBF16;
    default:
      TORCH_CHECK(false, "actbench::", op, ": mask must be bool, float32, float16 or bfloat16, got ", t);
  }
}

inline void check_mixed_bits(const at::Tensor& bits, const Groups& gr, const char* op) {
  TORCH_CHECK(bits.scalar_type() == at::kInt && bits.dim() == 1 && bits.size(0) == gr.n, "actbench::", op,
              ": bits must be int32 [", gr.n, "], got ", bits.scalar_type(), " ", bits.sizes());
}

// Checks that the per-sample bits lie in 1..8 and sum to total_bits. Only possible without a
// device sync on the CPU; the CUDA kernels instead bound every write by the output size.
inline void check_mixed_bits_values(const at::Tensor& bits_cpu, int64_t total_bits, const char* op) {
  const int32_t* b = bits_cpu.data_ptr<int32_t>();
  int64_t sum = 0;
  for (int64_t i = 0; i < bits_cpu.numel(); ++i) {
    TORCH_CHECK(b[i] >= 1 && b[i] <= 8, "actbench::", op, ": bits[", i, "] must be in 1..8, got ", b[i]);
    sum += b[i];
  }
  TORCH_CHECK(total_bits < 0 || sum == total_bits, "actbench::", op, ": total_bits must equal sum(bits) = ", sum,
              ", got ", total_bits);
}

inline void check_packed(const at::Tensor& codes, const at::Tensor& lo, const at::Tensor& scale, const Groups& gr,
                         const char* op) {
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.dim() == 1, "actbench::", op,
              ": codes must be a 1-D uint8 tensor, got ", codes.scalar_type(), " ", codes.sizes());
  for (const at::Tensor* t : {&lo, &scale}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->dim() == 2 && t->size(0) == gr.n && t->size(1) == gr.g,
                "actbench::", op, ": lo and scale must be bfloat16 [", gr.n, ", ", gr.g, "] for the given shape, got ",
                t->scalar_type(), " ", t->sizes());
    check_same_device(codes, *t, op, "lo/scale");
  }
}

inline Pool2d pool_geometry(c10::IntArrayRef in_shape, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                            c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode, const char* op) {
  TORCH_CHECK(in_shape.size() == 3 || in_shape.size() == 4, "actbench::", op,
              ": input must be [C, H, W] or [N, C, H, W], got ", in_shape);
  TORCH_CHECK(kernel.size() == 2 && stride.size() == 2 && padding.size() == 2 && dilation.size() == 2, "actbench::",
              op, ": kernel_size, stride, padding and dilation must have 2 values each");
  TORCH_CHECK(kernel[0] > 0 && kernel[1] > 0 && stride[0] > 0 && stride[1] > 0 && dilation[0] > 0 && dilation[1] > 0,
              "actbench::", op, ": kernel_size, stride and dilation must be positive, got ", kernel, ", ", stride, ", ",
              dilation);
  TORCH_CHECK(kernel[0] * kernel[1] <= 127, "actbench::", op,
              ": the window must hold at most 127 values (int8 argmax), got kernel_size ", kernel);
  TORCH_CHECK(padding[0] >= 0 && padding[1] >= 0 && padding[0] * 2 <= kernel[0] && padding[1] * 2 <= kernel[1],
              "actbench::", op, ": padding must be at most half the kernel size, got ", padding);
  Pool2d p;
  p.in_h = in_shape[in_shape.size() - 2];
  p.in_w = in_shape[in_shape.size() - 1];
  p.kh = static_cast<int>(kernel[0]);
  p.kw = static_cast<int>(kernel[1]);
  p.sh = static_cast<int>(stride[0]);
  p.sw = static_cast<int>(stride[1]);
  p.ph = static_cast<int>(padding[0]);
  p.pw = static_cast<int>(padding[1]);
  p.dh = static_cast<int>(dilation[0]);
  p.dw = static_cast<int>(dilation[1]);
  auto out_size = [&](int64_t size, int k, int s, int pad, int d) {
    int64_t span = size + 2 * pad - static_cast<int64_t>(d) * (k - 1) - 1;
    int64_t o = (span + (ceil_mode ? s - 1 : 0)) / s + 1;
    if (ceil_mode && (o - 1) * s >= size + pad) --o;
    return o;
  };
  p.out_h = out_size(p.in_h, p.kh, p.sh, p.ph, p.dh);
  p.out_w = out_size(p.in_w, p.kw, p.sw, p.pw, p.dw);
  TORCH_CHECK(p.out_h > 0 && p.out_w > 0, "actbench::", op, ": output would be empty for input ", in_shape,
              " and kernel_size ", kernel);
  return p;
}

// Output shape of a 2-D max pool: the input's with the last two sizes replaced.
inline std::vector<int64_t> pool_output_shape(c10::IntArrayRef in_shape, const Pool2d& p) {
  std::vector<int64_t> shape(in_shape.begin(), in_shape.end());
  shape[shape.size() - 2] = p.out_h;
  shape[shape.size() - 1] = p.out_w;
  return shape;
}

// Geometry for the pool backward. ceil_mode may have added a last window: the saved argmax's
// spatial size is the truth for the output side.
inline Pool2d pool_backward_geometry(const at::Tensor& grad, const at::Tensor& arg, c10::IntArrayRef in_shape,
                                     c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                                     c10::IntArrayRef dilation, const char* op) {
  Pool2d p = pool_geometry(in_shape, kernel, stride, padding, dilation, false, op);
  const Pool2d ceil = pool_geometry(in_shape, kernel, stride, padding, dilation, true, op);
  TORCH_CHECK(arg.scalar_type() == at::kChar && arg.sizes() == grad.sizes() &&
                  arg.dim() == static_cast<int64_t>(in_shape.size()),
              "actbench::", op, ": argmax must be int8 with grad_out's shape ", grad.sizes(), ", got ",
              arg.scalar_type(), " ", arg.sizes());
  check_same_device(grad, arg, op, "argmax");
  // grad_out is the forward's output: the input's leading sizes, and its windows with or without ceil_mode
  bool leading = true;
  for (size_t d = 0; d + 2 < in_shape.size(); ++d) {
    leading = leading && grad.size(static_cast<int64_t>(d)) == in_shape[d];
  }
  const int64_t oh = grad.size(-2), ow = grad.size(-1);
  TORCH_CHECK(leading && ((oh == p.out_h && ow == p.out_w) || (oh == ceil.out_h && ow == ceil.out_w)), "actbench::",
              op, ": grad_out ", grad.sizes(), " is not a max pool output of input ", in_shape, " (windows ", p.out_h,
              "x", p.out_w, ", or ", ceil.out_h, "x", ceil.out_w, " with ceil_mode)");
  p.out_h = oh;
  p.out_w = ow;
  return p;
}

// Number of values of an unpacked mask; checks that ``packed`` holds exactly their bits.
inline int64_t check_unpack_mask(const at::Tensor& packed, c10::IntArrayRef shape, const char* op) {
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 1 && packed.numel() == (numel + 7) / 8,
              "actbench::", op, ": packed must be uint8 [", (numel + 7) / 8, "] for shape ", shape, ", got ",
              packed.scalar_type(), " ", packed.sizes());
  return numel;
}

}  // namespace actbench
