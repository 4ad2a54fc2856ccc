"""The device conformance suite, runnable against any installed device.

    pytest --pyargs ember.testing --device=CL

checks a device against numpy and against ember's PYTHON reference device: elementwise ops
on every dtype the device supports, reductions, movement ops, matmul, copies between
devices, 0-d and size-0 tensors, autograd, and batched graph replay when the device has one.
Every first-party plugin runs it in CI; a third-party plugin should too.
"""
