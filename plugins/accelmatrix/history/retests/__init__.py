"""Re-tests of suspect changes: the controller (``followup``, the entry), the statistics of
two builds on one machine (``compare``, ``sequential``), the policy (``confirm``), the
search over builds (``bisect``, ``builds``), sessions' samples (``session``), a culprit's
placement (``placement``) and on-demand comparisons (``build_compare``)."""
