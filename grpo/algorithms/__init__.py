"""The math of GRPO and its family: pure functions, tensors in and tensors out, each with its
paper's formula (advantage estimators, the clipped surrogate and KL estimators, loss aggregation,
reward and sample shaping). Imports nothing from the rest of grpo."""
