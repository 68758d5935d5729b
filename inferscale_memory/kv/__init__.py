"""Device-side pieces of the KV path: RoPE shifts, cache-map probing, the KV pool."""
