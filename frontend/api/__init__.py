"""The API dialects, each a room over the shared engine path (frontend/engine_path.py,
through serving.py's chat path)."""
