"""Step-time bounds re-centered from the perf history (``bounds_job``, the entry)."""
