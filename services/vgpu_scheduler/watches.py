"""``informers``: the five watches that feed ``ClusterState``.

Nodes (only those matching ``scheduler.nodeLabelSelector``, slimmed to what scheduling reads),
pods (slimmed likewise), the device plugin Leases in ``scheduler.leaseNamespace``, ResourceQuotas
and Namespaces. Each event goes straight to ``ClusterState.apply``.
"""

from vgpu.kube import informer, slim
from vgpu.kube.port import KubeApi

from vgpu_scheduler.state import ClusterState


def informers(api: KubeApi, state: ClusterState) -> list[informer.Informer]:
    """The five watches that feed ``state`` (callbacks are plain functions: applied in order, and
    the first list is fully applied before anyone sees ``synced``)."""
    config = state.config.scheduler

    def feed(kind: str) -> informer.Callback:
        def on_event(change: informer.Change) -> None:
            state.apply(kind, change.type, change.object)

        return on_event

    return [
        informer.Informer(
            api,
            "nodes",
            label_selector=config.node_label_selector or None,
            on_event=feed("nodes"),
            transform=slim.node_for_scheduling,
        ),
        informer.Informer(
            api,
            "pods",
            on_event=feed("pods"),
            transform=slim.pod_for_scheduling,
            on_list_starting=state.bindings.listing,
            on_listed=state.pods_listed,
        ),
        informer.Informer(api, "leases", namespace=config.lease_namespace, on_event=feed("leases")),
        informer.Informer(api, "resourcequotas", on_event=feed("resourcequotas")),
        informer.Informer(api, "namespaces", on_event=feed("namespaces")),
    ]
