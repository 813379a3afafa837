"""The online algorithms (PPO, GRPO) as objects: what each needs and does around the update step.

`registry.online_algorithm(config)` is the one place that looks at a stage config's type: it picks
the algorithm from `registry.ONLINE_ALGORITHMS`. The colocated loop (`trainer.online.loop`), the
stage that builds it (`trainer.online.stages`) and the asynchronous engine (`trainer.asynchronous`)
ask the algorithm object (`base.OnlineAlgorithm`) instead of testing the config's class. The formulas
stay pure functions in `trainer.algorithms.ppo`, `grpo` and `advantages`; these objects only read the
config and call them.
"""
