"""runs: see docs/architecture.md."""
