"""HTTP routers: each translates HTTP to one call of the core and back, nothing more."""
