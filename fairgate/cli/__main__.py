"""``python -m fairgate.cli``: the same command as ``fairgate``."""

import sys

from fairgate.cli import main

sys.exit(main())
