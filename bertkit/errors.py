"""The one exception type bertkit raises for bad input: the CLI prints its message, no traceback."""


class BertkitError(Exception):
    """A problem with the user's input (file, folder, option) described in words."""
