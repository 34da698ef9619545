"""The statistics core: every verdict curryTrain gives (compare, seeds, ablation, scaling, sweeps) is decided
here, on numpy and scipy alone. It sits at the bottom of the house: it imports no torch, no Hydra and no
other room of curryTrain (the contract `stats-pure` in .importlinter holds it there)."""
