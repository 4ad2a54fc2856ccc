"""ember's CPU device: C kernels built with the system C compiler (OpenMP when available), run through cffi."""

__version__ = "0.1.0"
