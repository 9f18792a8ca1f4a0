"""Serving (the model thread): continuous batching, prefix KV reuse, tokens to text and the API's bytes."""
