"""The Chat Completions ingress: the canonical wire format itself."""
