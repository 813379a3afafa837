"""The rm component."""
