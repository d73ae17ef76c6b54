"""Names of the files a model repo's recipe lives in, known to every stage (reading, hashing, publishing, init).

Example:
    >>> RECIPE_FILE, RECIPE_SOURCES
    ('export_config.json', ('export_config.json', 'config.json'))
"""

RECIPE_FILE = "export_config.json"
CONFIG_FILE = "config.json"  # may hold the recipe too, under its `export_config` field
RECIPE_SOURCES = (RECIPE_FILE, CONFIG_FILE)
EXPORTS_DIR = "exports"  # a model repo's folder of exported targets (one subfolder per target)
