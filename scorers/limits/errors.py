"""What a shared endpoint limit raises: each error names the endpoint and the limit. Stdlib only."""

from __future__ import annotations


class LimitError(Exception):
    """A shared endpoint limit could not be honoured or set up."""


class LimitTimeout(LimitError):
    """The wait for the endpoint's limit would pass the call's deadline: the item fails with this
    (never a 0, never a retry against the endpoint)."""

    def __init__(self, endpoint: str, limit: str, waited_s: float, detail: str = "") -> None:
        self.endpoint, self.limit, self.waited_s = endpoint, limit, waited_s
        more = f"; {detail}" if detail else ""
        super().__init__(
            f"endpoint {endpoint!r}: its {limit} leaves no room before the deadline (waited "
            f"{waited_s:.2f} s){more}"
        )


class LimitConflict(LimitError):
    """Another live process on this node declared other limits for the same endpoint name."""


class LimitStateError(LimitError):
    """The limits' private directory or an endpoint's state file cannot be used (not ours, not
    private, unreadable): named with its path."""
