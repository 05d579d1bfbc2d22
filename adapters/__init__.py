"""Transports in and out (receive locations, send ports), found by URL scheme.
Not built yet."""
