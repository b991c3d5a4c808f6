"""The layering of docs/architecture.md and the tests' own layout, checked on the source."""
