"""One-off measurements behind figures in docs/: ``python -m benchmarks.NAME`` (repo root)."""
