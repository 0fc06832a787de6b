"""The one-line errors that every layer raises (the command line prints them as one line, exit code 2)."""


class ConfigError(ValueError):
    """A configuration or request that cannot be satisfied; its message is one line."""


class AnalysisFailure(RuntimeError):
    """An unexpected error (a bug, not a user's input) inside one analysis at one checkpoint: where it happened,
    for the one line the command line prints (the original error is its ``__cause__``)."""

    def __init__(self, analysis: str, step: int, family: str, error: BaseException):
        self.analysis, self.step, self.family, self.error = analysis, step, family, error
        first = str(error).splitlines()[0] if str(error) else ""
        super().__init__(f"{analysis} at step {step} on {family}: {type(error).__name__}: {first}")
