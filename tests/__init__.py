"""The test suite: tests/unit (one process), tests/integration (real nginx, engine, redis),
tests/support (what the tests and bench/ share)."""
