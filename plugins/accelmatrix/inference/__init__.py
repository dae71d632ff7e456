"""Model x config inference testing: model configs validated at plan time, golden cases.

``configs`` is imported by the suite loader (parse time, pydantic only); the golden-case
runner and the local model server are workloads under include/workloads/inference/.
"""
