"""The SSH machine family: a cell is a process group on a host reached over SSH.

``backend`` (``SshBackend``, named by the registry; ``DirectSshBackend`` for a host the TPU VM
family provisioned), ``remote`` (the host-side primitives: reading files, liveness, killing a
group, fetching logs), ``setup`` (the setup commands, streamed). The workload runner and its
``status.json`` are shared with the local family (``accelmatrix.backends.runner``).
"""
