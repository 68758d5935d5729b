"""Device-side pieces of the KV path: RoPE shifts, cache-layout probing, the KV pool."""
