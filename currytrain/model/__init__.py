"""Model architectures (conf/model/). Each family lives in its own module; import them directly.

Beyond forward(tokens) -> logits, a model may implement two optional methods that the trainer uses:

- auxiliary_loss() -> Tensor: the weighted sum of the extra losses of the last forward pass
  (MoE load balancing, router z-loss); added to the task loss before backward.
- training_metrics() -> dict[str, float]: per-layer statistics of the last forward pass
  (expert load, drop rate, spike rate), logged with the train metrics.

The protocols are in currytrain.model.hooks. This package imports no torch, so composing a
config (which imports the config dataclasses beside it) stays fast.
"""

