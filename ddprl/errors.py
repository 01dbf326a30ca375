"""Errors a user can act on."""


class UsageError(Exception):
    """Bad input: the CLI prints ``ddprl: error: <message>`` (one line) and exits with code 2."""
