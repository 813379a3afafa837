"""The sft component."""
