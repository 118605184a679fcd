"""The command-line tools: ``conveyor`` (``cli``), ``conveyor bench`` (``bench``) and
``conveyor demo`` (``demo``).

Internal: nothing here is public API but the commands.
"""
