"""Built-in context contributors, each a ``ContributorFactory`` registered by entry point."""
