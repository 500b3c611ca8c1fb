"""GPU backends: the ``GpuBackend`` port (``port``), NVML (``nvml``) and a YAML-described fake (``fake``)."""
