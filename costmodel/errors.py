"""One exception type for every user-facing input error: one line, exit 2 (§18)."""


class TpcostError(ValueError):
    """Bad user input; its message is one line (§18)."""

    # Unknown GPU or model, malformed file, impossible shape.
