"""The device conformance suite (a pytest plugin)."""
