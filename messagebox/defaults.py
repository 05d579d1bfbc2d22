"""Defaults the command line needs before it imports the engine (kept light: starting a
command should not cost the database drivers' import time)."""

DEFAULT_URL = "duckdb:///messagebox.duckdb"
"""Where a store is when no URL is given: a DuckDB file in the working directory."""
