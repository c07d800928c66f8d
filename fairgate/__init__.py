"""The ``fairgate`` command (``fairgate.cli``): the top of the house, it may use every package below."""
