"""The response cache: fingerprints and keys (fp/, fingerprint, keys, masks), the Redis
store (store), and what an entry holds (answer). docs/fingerprint.md is the spec."""
