"""The C++/CUDA extension: its build, its ops and their fake kernels, the pure-PyTorch oracle, benchmarks."""
