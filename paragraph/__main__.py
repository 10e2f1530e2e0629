"""``python -m paragraph``: the same as the ``paragraph`` command."""

import sys

from paragraph.cli import main

sys.exit(main())
