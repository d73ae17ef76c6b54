"""The version of export-action (the package's, recorded in every report)."""

__version__ = "0.1.0"
