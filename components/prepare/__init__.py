"""The prepare component."""
