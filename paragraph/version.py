"""paragraph's version (a leaf module: `machine` reports it without importing the package)."""

__version__ = "0.1.0"
