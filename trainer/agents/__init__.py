"""Agents: multi-turn episodes in environments with tools (docs/agents.md).

`environment` (the interface), `tools` (function tools, the code tool), `formats` (tool-call and
observation text), `rollout` (the multi-turn loop), `scheduler` (when episodes take their turns:
lockstep, or each as soon as it is ready), and `sandbox` (where the code tool runs; docs/sandbox.md). Environments and tools are chosen by name through the platform's allow-list,
`trainer.allow_list`, as reward functions are.
"""
