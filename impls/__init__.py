"""Backends shipped with opdispatch, one subpackage per backend with the same module names."""
