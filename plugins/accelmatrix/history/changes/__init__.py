"""Change points kept current in the results store: the pass a gate and the maintenance DAG
run (``history_pass``, the entry), matching and retraction (``changes``), triage and the
report (``triage``, ``change_report``)."""
