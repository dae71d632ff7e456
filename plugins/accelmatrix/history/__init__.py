"""Perf history: series of a metric per (benchmark, cell) over runs, and their verdicts."""
