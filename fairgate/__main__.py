"""``python -m fairgate``: the ``fairgate`` command (for a process started from Python, e.g. a bench arm)."""

import sys

from fairgate.cli import main

sys.exit(main())
