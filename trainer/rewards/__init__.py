"""Reward sources beyond one function: weighted sums, verifiable checks, reward services, LLM judges.

`weighted` builds the stage's scorer from `reward.sources`; `verifiable` holds the built-in checks
(math answer equivalence, exact match, format); `service_client` the HTTP client every remote
source shares; `remote` and `judge` the two remote kinds; `server` the reference reward server.
docs/rewards.md describes the config keys and the service schema.
"""
