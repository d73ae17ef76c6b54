"""The support matrix: every family of `matrix.families` through the plainest recipe, in every format, measured.

Run it with `make coverage` (or `python -m matrix`); it writes docs/coverage.md.
"""
