"""The shared kernel: the canonical form, errors, the JSON codec, settings and the client-parameter policy.

Every layer may import these modules; they import nothing else of ours (see docs/architecture.md)."""
