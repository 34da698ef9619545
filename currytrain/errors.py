"""The error type for user mistakes: bad config values, missing paths. Reported as one message, exit code 2."""

EXIT_CONFIG_ERROR = 2
"""Exit code of every user error (bad config, bad path), from launch.py and the currytrain command."""


class ConfigError(ValueError):
    """A problem the user fixes by changing the config or a path; the message names the key and the fix."""
