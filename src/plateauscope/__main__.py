"""``python -m plateauscope <verb>``: the same as the ``plateauscope`` command."""

import sys

from plateauscope.cli import main

sys.exit(main())
