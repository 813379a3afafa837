"""The dpo component."""
