"""capture: see docs/architecture.md."""
