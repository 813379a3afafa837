"""Agents: the environments episodes run in and the tools they call (docs/agents.md).

`environment` (the interface) and `tools` (function tools, the code tool). The tool-call and observation
text is data code, `trainer.data.tool_calls`; the code tool runs in `trainer.sandbox` (docs/sandbox.md).
Environments and tools are chosen by name through the platform's allow-list, `trainer.allow_list`, as reward
functions are.
The episodes themselves (turns sampled by a rollout engine, the schedule of their turns, the batch)
are multi-turn rollouts: `trainer.rollout.multi_turn` and `trainer.rollout.turn_scheduler`.
"""
