"""The Tensor API beyond the primitives, one mixin per family of ops.

``ember.tensor.Tensor`` inherits every mixin here. Mixins only call Tensor methods on
``self`` (and ``type(self)`` to build new tensors), so they never import the tensor module.
"""
