"""``python -m slime.cli ...``: the ``slime`` command (``slime.cli.main``), as torchrun and the scripts launch it."""

import sys

from slime.cli import main

sys.exit(main())
