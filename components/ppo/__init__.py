"""The ppo component."""
