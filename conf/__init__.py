"""curryTrain's config tree (Hydra's search path entry pkg://currytrain.conf for projects made by `currytrain init`)."""
