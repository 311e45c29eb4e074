"""Operator commands on what the proxy keeps: ``context-proxy sessions list | delete``."""
