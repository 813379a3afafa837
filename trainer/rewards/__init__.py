"""Reward sources: reward functions and models, weighted sums, verifiable checks, code tests, services, LLM judges.

`weighted` builds the stage's scorer from `reward.sources`; `functions` runs a reward function that
`function_registry` resolves from the platform's allow-list; `reward_model` scores with a trained
reward model; `verifiable` holds the built-in checks (math answer equivalence, exact match, format);
`code_tests` runs test cases in the sandbox; `service_client` the HTTP client every remote source
shares; `remote` and `judge` the two remote kinds; `server` the reference reward server. The
scorers that work row by row subclass `trainer.rollout.scoring.RowScorer`.
docs/rewards.md describes the config keys and the service schema.
"""
