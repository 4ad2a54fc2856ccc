"""Built-in devices that need no plugin: PYTHON (a numpy interpreter of linear UOp programs), DISK and NPY."""
