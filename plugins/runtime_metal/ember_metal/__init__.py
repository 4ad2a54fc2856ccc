"""ember's Metal device: kernels rendered to Metal Shading Language, built and run through the Objective-C runtime."""

__version__ = "0.1.0"
