"""Your own components. A config may name a class here as `_target_` once it is registered: by a schema's `_target_`
(experiments/<name>/config.py's SCHEMAS) or in TARGETS below (curryTrain builds nothing a config names that no
Python code of the project registered: docs/config.md)."""

TARGETS = ["experiments.param_budget.ParamBudget"]
"""Classes and functions configs may name as _target_ beyond those of the registered schemas (dotted names)."""
