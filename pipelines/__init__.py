"""Receive and send pipelines, and Spark batch routing (DESIGN.md §11). Not built yet."""
