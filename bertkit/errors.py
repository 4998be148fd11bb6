"""The one exception type bertkit raises for bad input: the CLI prints its message, no traceback."""


class BertkitError(Exception):
    """A problem with the user's input (file, folder, option) described in words."""


class Interrupted(Exception):
    """A run stopped by SIGINT or SIGTERM after saving its state; the CLI prints one line."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum  # the shell's convention: 130 for Ctrl-C, 143 for SIGTERM
