"""``python -m messagebox.cli``."""

import sys

from messagebox.cli import main

sys.exit(main())
