"""``vgpu demo``: the whole system on one machine (local cluster + real services + sample workload)."""
