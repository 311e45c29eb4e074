"""An OpenAI-compatible proxy that assembles every model call's context from a session store."""

__version__ = "0.1.0"
