"""Model runtime: GGUF loading, tokenizer, forward pass, batch-first engine. No Redis, no gRPC."""
