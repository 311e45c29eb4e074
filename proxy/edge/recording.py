"""Recording live traffic at the client's edge: a capture opened around each POST request.

The capture collects the request as received, the answer as sent and, through the recording backend
(``proxy/provider/recording.py``), every provider call the request made; it is written when the response
is complete. Installed only when ``CONTEXT_PROXY_RECORD_DIR`` (or ``serve --record``) is set.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.provider.recording import Recorder


class RecordingMiddleware:
    """Opens a capture for each POST request and writes it when the response is complete."""

    def __init__(self, app: ASGIApp, recorder: Recorder) -> None:
        self.app = app
        self.recorder = recorder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request, capturing its body, its answer and the provider calls it makes."""
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers") or []
        }
        query = scope.get("query_string", b"").decode("latin-1")
        capture = self.recorder.begin(scope["method"], scope["path"] + (f"?{query}" if query else ""), headers)

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                capture.body.extend(message.get("body", b""))
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                capture.status = int(message["status"])
                for name, value in message.get("headers") or []:
                    if name == b"x-context-id":
                        capture.context_id = value.decode("latin-1")
                    elif name == b"x-context-mode":
                        capture.mode = value.decode("latin-1")
            elif message["type"] == "http.response.body":
                capture.answer.extend(message.get("body", b""))
            await send(message)

        try:
            with self.recorder.capturing(capture):
                await self.app(scope, receiving, sending)
        finally:
            self.recorder.finish(capture)
