"""text: see docs/architecture.md."""
