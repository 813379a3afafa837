"""One module per algorithm: its loss functions and its `Objective` (forward + loss on a micro-batch).

`trainer.algorithms.update.train_step` is the single update step every trainer path calls.
`trainer.algorithms.online` holds PPO and GRPO as objects the online loops ask, chosen from the
stage config in one table.
"""
