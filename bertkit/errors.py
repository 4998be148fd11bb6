"""The one exception type bertkit raises for bad input (the CLI prints its message, no
traceback), and the integer check the Python API shares."""


class BertkitError(Exception):
    """A problem with the user's input (file, folder, option) described in words."""


class Interrupted(Exception):
    """A run stopped by SIGINT or SIGTERM after saving its state; the CLI prints one line."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum  # the shell's convention: 130 for Ctrl-C, 143 for SIGTERM


def check_int(value, name: str, minimum: int = 1) -> int:
    """An integer argument of the Python API (not a float, a bool or a string) of at least
    minimum, or a BertkitError naming it: `batch_size=2.5` failed deep inside as a TypeError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BertkitError(f"{name} must be an integer of at least {minimum}, got {value!r}")
    return value
