"""curryTrain's config tree (Hydra's search path entry pkg://currytrain.conf for projects made by `currytrain init`).

CONF_DIR is its folder. This module imports nothing, so every layer may ask where the tree is.
"""

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent
"""curryTrain's config tree: conf/ of the checkout (currytrain/conf links to it), package data when installed."""
