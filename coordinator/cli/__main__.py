"""``python -m knnmon.coordinator.cli``: the ``knnmon`` command."""

import sys

from knnmon.coordinator.cli import main

sys.exit(main())
