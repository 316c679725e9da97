"""``python -m linkguard.cli``: the ``linkguard`` command (the lab starts its processes so)."""

import sys

from linkguard.cli import main

sys.exit(main())
