"""The cleanup component."""
