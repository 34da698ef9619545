"""The validation ladder (conf/check/): stages a model climbs before it may burn compute.

stage.py defines what a stage is (Stage, StageContext, StageResult, Finding); skeleton.py, preflight.py and
sanity.py are the stages; ladder.py climbs them and raises GateFailed at the first failed gate; report.py
and figures.py write report.md, the PNGs and the console table. See docs/ladder.md.
"""
