"""The native backend: this project's C++ kernels (``_opdispatch_native``) and its layouts."""
