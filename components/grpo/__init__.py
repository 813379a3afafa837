"""The grpo component."""
