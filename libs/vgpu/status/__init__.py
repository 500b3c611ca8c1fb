"""``vgpu status``: the GPUs of a real cluster as a table, read from the same annotations the scheduler reads.

    vgpu status [--kubeconfig PATH] [--watch] [--interval S] [--config vgpu.yaml]

Per node: whether its device plugin is reporting (the Lease ``vgpu-device-plugin-<node>`` in the
configured lease namespace, stale after ``scheduler.leaseTimeoutS`` = 40 s by default), and each
GPU from the register annotation (``hami.io/node-nvidia-register``): model, health, cordon, memory
and cores allocated / total, memory used outside kube-vgpu (the device plugin's
``hami.io/node-nvidia-outside-usage``; ``-`` when none), slots used / total and the pods sharing it. Usage is rebuilt from
every unfinished pod's ``hami.io/vgpu-devices-allocated`` on its ``hami.io/vgpu-node``, collapsed
as the scheduler does (``vgpu.core.usage``). A corrupt register annotation or pod annotation is
shown with the decoder's reason instead of being skipped. Only nodes that take part are listed
(a register annotation, a plugin lease or an assigned pod); the others are counted.

Nodes in the DRA mode are rows of the same table, their PLUGIN column reading ``DRA
(ResourceSlice)``: GPUs from our driver's ResourceSlices, usage from the ResourceClaims allocated on
them (``vgpu.core.dra.usage``), slots without a total (``2/-``: DRA sets no slot limit), pods those
the claims are reserved for.

``snapshot`` reads one ``ClusterStatus`` through any ``KubeApi`` (``collect``), ``table`` renders it,
so tests drive both with the local cluster; ``command`` is the command (the official client from a
kubeconfig, ``--watch``).
"""

from vgpu.status.command import add_arguments, run_status

__all__ = ["add_arguments", "run_status"]
