"""The pure core of kube-vgpu: decisions as functions of values.

Standard library only: no asyncio, no I/O, no clock reads (time is a parameter).
"""
