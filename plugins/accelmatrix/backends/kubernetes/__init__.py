"""The Kubernetes machine family: a cell as a Job (``k8s-job``), a JobSet (``k8s-jobset``) or
a TPU slice on GKE (``gke-tpu``, a JobSet with XPK's pod shape).

One module per concept, each a small object or a set of pure functions the backends compose
(the registry names the backend classes by path; nothing is imported here, so reading one
piece does not load the rest):

* ``job_manifest``, ``jobset_manifest``: the bodies sent to the API, pure (no call, no clock).
* ``job_api``: creating, reattaching to and deleting Jobs and JobSets.
* ``pods``: what a pod's state means (infrastructure problem, exit, start time), pure.
* ``job_pods``, ``jobset_verdict``, ``jobset_reader``: the verdict on a Job or a JobSet.
* ``logs``, ``pod_logs``: every pod's log followed into a spool, kept whole across rotations.
* ``job_artifacts``, ``jobset_artifacts``: what a finished cell leaves for evaluation.
* ``job_setup``: the setup Job.
* ``job_inventory``, ``jobset_inventory``: the janitor's listing.
* ``unreachable``: an API outage is waited out, then reported as infrastructure.
* ``job``, ``jobset``, ``gke_tpu``: the backends, which wire these together.
"""
