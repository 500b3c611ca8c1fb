"""Kubernetes adapters: the KubeApi port, the official-client adapter and watch-fed caches.

This package is the only place that imports ``kubernetes``.
"""
