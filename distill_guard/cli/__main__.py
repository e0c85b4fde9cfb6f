"""``python -m distill_guard.cli``: the ``distill-guard`` command."""

import sys

from distill_guard.cli import main

sys.exit(main())
