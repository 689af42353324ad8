"""One exception type for every user-facing input error (the CLI turns it into one line, exit 2)."""


class TpcostError(ValueError):
    """Bad user input: unknown GPU or model, malformed file, impossible shape. Message is one
    line."""
