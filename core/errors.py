"""Errors a user can cause, raised with a sentence that says what to fix."""


class ConfigError(ValueError):
    """Flags, files or settings that cannot work together; the CLI prints it and exits 2."""
