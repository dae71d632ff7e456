"""Suite spec: the pydantic models of a suite YAML and its loader."""

from accelmatrix.spec.loader import SuiteError, load_suite, load_suites, suite_id
from accelmatrix.spec.suite import Suite

__all__ = ["Suite", "SuiteError", "load_suite", "load_suites", "suite_id"]
