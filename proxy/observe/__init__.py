"""Observation of model calls: Prometheus metrics and OpenTelemetry spans, fed from the runner's call records."""
