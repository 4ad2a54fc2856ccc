"""ember's OpenCL device: kernels rendered to OpenCL C, built and launched through pyopencl."""

__version__ = "0.1.0"
