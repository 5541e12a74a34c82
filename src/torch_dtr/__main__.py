"""``python -m torch_dtr``: the ``torch-dtr`` command."""

import sys

from .cli import main

sys.exit(main())
