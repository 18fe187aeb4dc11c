"""The API dialects, each a room over the shared engine path (frontend/serving.py)."""
