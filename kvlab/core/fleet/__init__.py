"""A fleet of engines: routers (routers.py)."""
