"""Datasets: reading rows from files, checking their schema, tokenizing (tool calls included), batching, sampling."""
