"""The fairgate command line."""
