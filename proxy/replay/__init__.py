"""Record and replay: capture real sessions with their provider exchanges, replay them through a new
build or configuration and see which turns would change (``context-proxy serve --record``,
``context-proxy replay``)."""
