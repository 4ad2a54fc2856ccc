"""ember's AMD GPU device: kernels rendered to OpenCL C, compiled by clang to code objects, run on KFD queues."""

__version__ = "0.1.0"
