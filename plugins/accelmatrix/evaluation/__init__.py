"""Evaluation layer: turn a cell's outputs and its checks into verdicts.

Importing this package is cheap (no pandas, no Great Expectations): both are imported on
the first ``evaluate_cell`` call, because DAG parsing must stay fast.
"""

from accelmatrix.contracts.check_verdicts import CellOutputs, CheckVerdict, EvaluationReport
from accelmatrix.evaluation.evaluate_cell import evaluate_cell

__all__ = ["CellOutputs", "CheckVerdict", "EvaluationReport", "evaluate_cell"]
