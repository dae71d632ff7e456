"""The typed records that cross a boundary: backend <-> steps, trigger <-> operator,
store <-> history and pages.

Each record is stated once here and spoken on both sides of its boundary, so no caller
re-maps a dict's fields. The package is a leaf: it imports nothing of accelmatrix but
``cell_state`` and ``errors``, and nothing heavy (backends, the spec and DAG parsing use it).
"""
