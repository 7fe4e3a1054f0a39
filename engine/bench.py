"""`python -m engine.bench`: the entry point of the engine workloads in `engine.tools.bench`.

Kept at this path so the documented command (and `make bench-engine`) stays short.
"""

from __future__ import annotations

import os

from engine.tools.bench import main

if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
