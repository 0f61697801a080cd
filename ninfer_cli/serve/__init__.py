"""`ninfer serve`: the OpenAI and Anthropic HTTP APIs over one model (FastAPI; the `serve` extra)."""
