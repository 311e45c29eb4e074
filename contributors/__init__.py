"""Built-in context contributors, each a ``ContextContributorFactory`` registered by entry point."""
