"""The errors a machine raises, below both hooks (which talk to a service) and backends
(which drive a machine with them): a hook can say "capacity is gone" without importing the
backend layer that reacts to it. ``accelmatrix.backends.base`` re-exports both.
"""


class BackendError(RuntimeError):
    """Base of the errors a backend (or the hook it drives) raises."""


class InfrastructureError(BackendError):
    """The machine failed us (capacity, preemption, provisioning): not a test failure."""
