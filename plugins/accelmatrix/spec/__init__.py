"""Suite spec: the pydantic models of a suite YAML (suite.py) and its loader (loader.py).

Nothing is re-exported here: importing a light module of this package (templating) must not
load every model (task processes import it on their hot path).
"""
