"""What frees machines and settles cells whose work was cut short.

``janitor`` (find and delete resources no live task owns, by their labels: per run at the
gate, and on a schedule), ``stopped`` (cells a person stopped: cancel the workload, record
the cell as cancelled) and ``clearing`` (a cleared cell: which of its steps run again).
Beside the steps, below them: the lifecycle calls in, never the other way round.
"""
