"""Optimizers and LR schedules (conf/optimizer/)."""
