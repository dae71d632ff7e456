"""The `machines.<name>` models of a suite YAML, one module per backend kind.

They live with the backends (not in `spec/`) because they are backend facts: the registry
(`accelmatrix.backends.machine_kinds`) pairs each with its backend class and capabilities, and
`spec/suite.py` builds its machine union from the registry. Each module needs only pydantic:
`spec` imports them while a DAG file is parsed, so nothing heavy belongs here.
"""
