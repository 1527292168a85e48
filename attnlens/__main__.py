"""``python -m attnlens`` (and ``torchrun -m attnlens``): the command line, :mod:`attnlens.cli`."""

import sys

from attnlens.cli import main

if __name__ == "__main__":
    sys.exit(main())
