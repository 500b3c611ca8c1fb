"""The per-container GPU usage monitor: HAMi-core shared regions and NVML, on /metrics."""
