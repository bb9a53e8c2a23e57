"""The one exception type the command line turns into a clean message."""


class LRCError(Exception):
    """Bad input or a failed check, with a message that names the culprit.

    `lrc <command>` prints it as ``error: <message>`` and exits with status 2,
    without a traceback; library users catch it like any other exception.
    """
