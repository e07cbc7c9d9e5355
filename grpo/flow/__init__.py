"""Flow-GRPO for flow-matching image generators (docs/flow.md): the SDE math (sde.py), samplers
(sampler.py), variants (variants.py), the loss (objective.py), models (models.py), tasks and rewards
(tasks.py), the sibling loop (loop.py: experience.py, update.py, evaluate.py), pre-training
(pretrain.py), the demo (demo.py) and the diffusers adapter (diffusers_adapter.py)."""
