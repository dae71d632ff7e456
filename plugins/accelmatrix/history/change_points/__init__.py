"""Change points kept current in the results store: the pass a gate and the maintenance DAG
run (``history_pass``, the entry), keeping them across nights: find, update, retract
(``tracking``), triage and the report (``triage``, ``report``)."""
