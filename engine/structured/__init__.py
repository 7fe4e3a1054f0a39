"""Structured outputs: constraints on what a request may generate, as a grammar's token mask."""
