"""A module whose import fails (as a user's module with a bad import inside would)."""

raise RuntimeError("this module fails at import: a missing GPU library, say")
