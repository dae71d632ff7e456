"""The Cloud TPU VM machine family: a cell is a TPU node (or a queued resource) whose workers
are SSH hosts.

``backend`` (``TpuVmBackend``, named by the registry: provisioning and teardown through the
gcloud hook), ``node_record`` (a node as the cell's resource record), ``workers`` (the
contract fanned out to one SSH backend per worker), ``inventory`` (the janitor's listing),
``ssh_keys`` (the key the workers are reached with).
"""
