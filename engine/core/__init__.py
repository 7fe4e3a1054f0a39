"""The engine step loop: scheduler, KV block manager, model runner, TP workers, front ends.

Imports flow down: `core` uses config, sampling, tokenizer, loader, layers, models and
kernels; none of those import `core`, and nothing here imports the gateway.
"""
