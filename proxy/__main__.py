"""``python -m proxy`` is the ``context-proxy`` command."""

import sys

from proxy.cli import main

sys.exit(main())
