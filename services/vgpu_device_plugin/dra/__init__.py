"""The device plugin's Dynamic Resource Allocation mode: the node's ResourceSlice (:mod:`slicepub`)
and the kubelet DRA plugin (registration, NodePrepareResources / NodeUnprepareResources)."""
