"""The evaluate component."""
