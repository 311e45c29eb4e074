"""The provider boundary: the backend protocol, the litellm backend and its fast routes, error translation
and overflow recognition, redaction, recording, and the scripted provider demo, replay and tests use."""
