"""rewardd's service layer: the HTTP API, the request contract, planning and the advantage library."""

__version__ = "0.1.0"
