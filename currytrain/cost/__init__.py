"""The cost group (conf/cost/): the accelerator a run is priced on, and `currytrain estimate` (estimate.py)."""
