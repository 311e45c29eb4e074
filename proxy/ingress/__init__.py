"""Ingresses: the wire formats other than Chat Completions, each a translation layer around one pipeline.

An ingress validates a request in its own API's shape (a 4xx in that API's error shape, nothing stored),
translates it into the canonical Chat Completions body, hands that to the same ``TurnRunner`` that
serves ``/v1/chat/completions``, and translates the answer (a completion, or a stream of chunks) back.
Session identity, modes, traces, proxy-owned tools, the overflow retry and the store are the runner's.
"""
