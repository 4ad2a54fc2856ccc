"""ember-foo: the example device plugin of docs/plugins.md (device ``FOO``: C kernels run through ctypes)."""

__version__ = "0.1.0"
