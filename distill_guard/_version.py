"""The one place the version is written: pyproject reads it (``[tool.setuptools.dynamic]``)."""

__version__ = "0.2.0"
