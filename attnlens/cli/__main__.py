"""``python -m attnlens.cli``: the command line, as ``attnlens`` and ``python -m attnlens``."""

import sys

from attnlens.cli import main

if __name__ == "__main__":
    sys.exit(main())
