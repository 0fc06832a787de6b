"""The one-line errors that every layer raises (the command line prints them as one line, exit code 2)."""


class ConfigError(ValueError):
    """A configuration or request that cannot be satisfied; its message is one line."""
