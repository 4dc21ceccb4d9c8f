// Every schema of the actbench op library, in one place. Kernels register per device in
// cpu/ops_cpu.cpp and cuda/ops_cuda.cpp; fake (meta) kernels are registered from Python
// (actbench/ops.py). Randomness is an explicit (seed, offset) pair: the ops are pure functions.
#include <torch/library.h>

TORCH_LIBRARY(actbench, m) {
  m.def("group_minmax(Tensor x, int group_size) -> (Tensor, Tensor)");
  m.def(
      "quantize(Tensor x, Tensor mn, Tensor mx, int bits, int group_size, int seed, int offset) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "quantize_mixed(Tensor x, Tensor mn, Tensor mx, Tensor bits, int total_bits, int group_size, int seed, "
      "int offset) -> (Tensor, Tensor, Tensor)");
  m.def(
      "dequantize(Tensor codes, Tensor lo, Tensor scale, int bits, int group_size, SymInt[] shape, "
      "ScalarType dtype) -> Tensor");
  m.def(
      "dequantize_mixed(Tensor codes, Tensor lo, Tensor scale, Tensor bits, int group_size, SymInt[] shape, "
      "ScalarType dtype) -> Tensor");
  m.def("pack_mask(Tensor mask) -> Tensor");
  m.def("unpack_mask(Tensor packed, SymInt[] shape) -> Tensor");
  m.def("apply_mask(Tensor grad, Tensor packed, float scale) -> Tensor");
  m.def(
      "max_pool2d_with_argmax(Tensor x, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, "
      "bool ceil_mode) -> (Tensor, Tensor)");
  m.def(
      "max_pool2d_backward(Tensor grad_out, Tensor argmax, SymInt[] input_shape, int[2] kernel_size, "
      "int[2] stride, int[2] padding, int[2] dilation) -> Tensor");
  m.def("allocate_bits(Tensor cost, Tensor weight, float target, int min_bits, int max_bits) -> Tensor");
}
