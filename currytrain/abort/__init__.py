"""The abort group (conf/abort/): conditions declared before launch that stop or roll back a run online.

AbortMonitor (monitor.py) is a StepHook: after every step it checks the enabled conditions and tells the
trainer to continue, stop (exit code 4) or roll back to the last good checkpoint.
"""
