"""Agents: multi-turn episodes in environments with tools (docs/agents.md).

`environment` (the interface), `tools` (function tools, the code tool), `formats` (tool-call and
observation text), `registry` (the platform's allow-list), `rollout` (the multi-turn loop), and
`sandbox` (where the code tool runs; docs/sandbox.md).
"""
