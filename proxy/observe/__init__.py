"""Observation of model calls: Prometheus metrics and OpenTelemetry spans, fed from the turn service's call records."""
