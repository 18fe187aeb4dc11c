"""Shared, torch-free code: configuration, wire messages, ZeroMQ helpers, logging."""
