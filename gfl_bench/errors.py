"""The one exception type that means "the user asked for something we cannot do"."""


class UserError(Exception):
    """Bad input or a missing resource. The CLI prints its message on one line and exits with 2."""
