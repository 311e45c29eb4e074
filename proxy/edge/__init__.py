"""The HTTP edge every ingress shares: reading a body within its limits, a resent history decoded once, the
digests of validated messages, authentication, error rendering, event streams and recording."""
