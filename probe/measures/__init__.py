"""measures: see docs/architecture.md."""
