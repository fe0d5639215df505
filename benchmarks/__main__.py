"""``python -m benchmarks <workload...|all> [--quick] [--json FILE] [--target ...]``: see benchmarks.harness."""

from __future__ import annotations

import sys

from benchmarks.harness import main

if __name__ == "__main__":
    sys.exit(main())
