"""A plain-TCP transport for rlinf (an example of a third-party plugin)."""

__version__ = "0.1.0"
