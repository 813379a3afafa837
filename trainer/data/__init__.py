"""Datasets: reading rows from files, checking their schema, tokenizing, batching, sampling."""
