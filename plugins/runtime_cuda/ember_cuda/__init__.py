"""ember's CUDA device: kernels rendered to CUDA C, compiled by NVRTC, run through the CUDA driver (cuda-python)."""

__version__ = "0.1.0"
