"""The package's version, at the bottom of the house: anything may import it, it imports nothing."""

__version__ = "0.1.0"  # the only version: pyproject.toml reads this literal statically (no import)
