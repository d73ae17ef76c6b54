"""`python -m exporters.recipe` rewrites the committed JSON Schema from the recipe models."""

from exporters.recipe.model import write_schema

write_schema()
