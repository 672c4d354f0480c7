"""``python -m serving [--host H] [--port P]``: the same as ``hybridflow serve``."""

import sys

from infra.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
