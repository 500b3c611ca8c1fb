"""kube-vgpu's Dynamic Resource Allocation mode, the pure part: the names every side agrees on
(:mod:`names`), what a ResourceClaim's allocation says about our GPUs (:mod:`allocation`), and the
objects we publish and convert. No I/O here; adapters live in the services and ``vgpu.kube``."""
