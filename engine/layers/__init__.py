"""Model building blocks: paged attention, sharding-ready linears, RoPE, norms, sampler."""
