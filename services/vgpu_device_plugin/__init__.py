"""The kube-vgpu device plugin daemon: advertises shared GPUs to kubelet and serves Allocate."""
