"""Metrics of a cell's run: where a workload's numbers are and how to read them.

* ``accelmatrix.metrics.sources``: the ``workload.metrics`` models of a suite and
  ``collect_metrics``, which turns a run's files and log into uniform metric rows.
* ``accelmatrix.metrics.profiler``: step time from a profiler trace (json + statistics only).

Nothing is re-exported here on purpose: importing the package must not pull pydantic into
code that only needs the trace parser, nor the other way round.
"""
