"""Data sources (conf/data/): byte corpora and synthetic token streams, cut into deterministic batches."""
