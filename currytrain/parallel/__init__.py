"""Parallelism (conf/parallel/): process groups, the device mesh and how the model is wrapped."""
