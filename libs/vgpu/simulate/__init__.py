"""``vgpu simulate``: capacity planning through the scheduler's own fit and scoring code.

``model`` reads the cluster and workload YAML, ``dra`` the ``--dra`` file's objects (``drafacts``
what the DRA placement reads of them), ``admit`` runs the webhook's decision, ``engine`` places the
pods (``draplace`` those in the DRA mode, as kube-scheduler's DRA allocation would; ``preemption``
the evictions), ``analysis`` computes utilisation and fragmentation, ``report`` and
``html_report`` present them, ``command`` is the CLI.
"""

from vgpu.simulate.command import add_arguments, main_simulate

__all__ = ["add_arguments", "main_simulate"]
