"""Ingress layers: other wire formats translated to the one canonical Chat Completions body and back.

An ingress validates a request in its API's shape (a 4xx in that API's error shape, nothing stored),
translates it to a body exactly like a ``/v1/chat/completions`` request, hands it to the same
``TurnService`` the chat route uses (so session identity, scope, modes, traces, proxy-owned tools, the
overflow retry and the store are shared), and translates the chat answer (a completion or a stream of
chunks) back into its API's response or event sequence. There is no second assembly path.
"""
