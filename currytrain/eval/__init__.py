"""What a trained model can do (conf/eval/, docs/evaluation.md): generation with a KV cache (`currytrain
generate`), and evaluators run in the training loop every eval.every steps and after training (`currytrain
eval`): held-out text sets and lm-evaluation-harness tasks from local files."""
