"""vgpu-scheduler: kube-scheduler extender (filter, bind), admission webhook and metrics in one app."""
