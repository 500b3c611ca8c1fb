"""The local cluster: an in-memory API server (store + HTTP door + fast door), admission webhooks,
and (elsewhere in this package) kube-scheduler and kubelet emulation, for tests and ``vgpu demo``.

Entry points: ``store.Store``, ``client.LocalKubeApi``, ``apiserver.ApiServer``.
"""
