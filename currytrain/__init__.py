"""curryTrain: a Hydra-native PyTorch experiment framework for LLM-style research runs.

Importing the package is cheap on purpose: torch and the heavy libraries load only in the
modules that build and run things, so `python launch.py --cfg job` stays fast.
"""

__version__ = "0.1.0"
