"""Tracking backends (conf/logger/) behind one protocol; TensorBoard + JSONL by default."""
