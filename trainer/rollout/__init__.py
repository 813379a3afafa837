"""Rollouts: prompt rows in, scored responses out, behind one interface (docs/online.md, "Rollouts").

`interface` (`Rollout`: collect rows -> `ScoredRollout`, sync weights, close), `builder` (the one
function that builds every rollout, `auto` resolved there, and the agent side of multi-turn ones),
`single_turn` (one response per row) and `multi_turn` (an episode per row in an environment of
`trainer.agents`, its turns scheduled by `turn_scheduler`), `scoring` (what a rollout asks of a
scorer), the engines behind them (`engines`: the interface and `hf`; `vllm_engine`, `vllm_lora`,
`weight_stream`; `engine_choice` for `auto`; `engine_registry`), and `experience` (the batch the
algorithms learn from). It sits below `trainer.algorithms`: nothing here imports an algorithm.
"""
