"""kubelet's reuse of init containers' devices, as a constraint on where the scheduler puts a pod.

kubelet's device manager (``devicesToAllocate``, pkg/kubelet/cm/devicemanager) allocates a pod's
containers in order, init containers first, keeping per pod a pool of reusable devices:

* each container takes devices from the pool first, without asking the device plugin, then the
  rest from the free devices (GetPreferredAllocation's answer first, with the pool's devices as
  ``mustIncludeDeviceIDs``);
* after a regular init container, its devices join the pool (it has ended before the next one
  starts); after a restartable init container (a sidecar) or an app container, its devices leave
  the pool (they stay in use).

So a GPU container after a regular init container gets that init container's devices. When it asks
for at least as many, it gets all of them and the pool is then empty (for a regular init container
the pool is then its own devices); when it asks for fewer, kubelet takes that many from the pool in
Go's map order, which nobody can predict. The device plugin refuses an Allocate whose IDs name
other GPUs than the scheduler's (``kubeletids``), so the scheduler must give the container that
reuses an init container's devices (its *heir*) every GPU of that init container, and cannot place
a pod where an heir asks for fewer GPUs than its init container leaves it.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpu.core.request import PodRequest


@dataclass(frozen=True)
class Links:
    """``heir``: regular init container index → the index of the container that reuses its
    devices (its GPUs must include the init container's). ``source`` is the inverse."""

    heir: dict[int, int]

    @property
    def source(self) -> dict[int, int]:
        return {heir: init for init, heir in self.heir.items()}


def links(request: PodRequest) -> Links | str:
    """Which container reuses which regular init container's devices, or why kubelet's choice for
    some container cannot be known (then no node can take the pod as the scheduler places it)."""
    heir: dict[int, int] = {}
    pool: int | None = None  # the regular init container whose devices are in kubelet's pool
    for index, container in enumerate(request.containers):
        if container is None:
            continue  # asks for no GPU: takes nothing from the pool
        if pool is not None:
            left = request.containers[pool]
            assert left is not None
            if container.count < left.count:
                return (
                    f"container {container.name} asks for {container.count} GPU(s), fewer than the "
                    f"{left.count} devices init container {left.name} leaves it: kubelet hands it "
                    f"{container.count} of those, chosen in no predictable order, so the scheduler "
                    f"cannot assign its GPUs (ask for at least {left.count} GPUs, or for none)"
                )
            heir[pool] = index
        regular_init = index < request.init_count and index not in request.sidecars
        pool = index if regular_init else None
    return Links(heir)
