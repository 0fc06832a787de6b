"""``python -m interp.patch``: an alias of ``plateauscope patch`` (the same options and output)."""

import sys

from plateauscope.cli.patch import main

if __name__ == "__main__":
    sys.exit(main())
