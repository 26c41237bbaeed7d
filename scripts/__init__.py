"""Entry-point scripts; a package so tests and tools can `from scripts.<name> import ...`."""
