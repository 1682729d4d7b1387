"""The shared operations the model families compose: matrix products (kernels, quant/),
attention over the paged pool, the elementwise steps, all layers in one C call, their GPU
launches, and the build of the C sources (csrc/) they run."""
