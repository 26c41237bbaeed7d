"""The one error a run raises before it starts: the message says what to change."""


class SetupError(RuntimeError):
    """A run that cannot start; the message says what to change."""
