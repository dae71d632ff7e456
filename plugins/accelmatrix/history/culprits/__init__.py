"""The culprit report: op-level diffs of profiler traces and the cause's class, stored with
a re-test's decision (``culprit_profile``, the entry; ``op_trace``, ``profile_diff``,
``attribution``)."""
