"""A tiny Llama (and tiny models of the other tested families), a character tokenizer and a checkable
arithmetic task, all built offline.

Used by the demo, the tests and the benchmark: nothing is downloaded.
"""
