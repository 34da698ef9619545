"""The training loop: Trainer (train, train_step) and run_accumulated_step."""
