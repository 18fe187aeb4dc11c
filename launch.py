"""Placeholder: replaced by the process orchestrator."""
