"""The OpenAI Responses ingress: ``POST /v1/responses`` (and ``/compact``), ``GET /v1/responses/{id}``."""
