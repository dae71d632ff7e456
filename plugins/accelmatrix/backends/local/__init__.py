"""The local machine family: a cell is a process group on the Airflow worker host.

``backend`` (``LocalBackend``, named by the registry), ``processes`` (liveness and killing a
process group), ``record`` (the resource record on disk), ``collect`` (artifact globs copied
out of a work dir, also used by the Kubernetes backends for their artifacts volume) and
``services`` (a workload's background services). The workload runner itself, shared with the
SSH family, is ``accelmatrix.backends.runner``.
"""
