"""``python -m gateway`` is the ``switchyard`` command."""

import sys

from gateway.cli import main

sys.exit(main())
