"""Perf series: the history table (``frame``), the change-point detector (``detector``),
the bounds-window verdicts (``regression``, ``series``), one cause per night's changes
(``grouping``) and the CLI's CSV reader (``csv_series``). The other history packages build
on these; they import none of them."""
