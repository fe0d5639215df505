"""``python -m spark_sink [DATA_DIR]``: the demo Structured Streaming job (the README's main job)."""

import sys

from spark_sink.demo import run_demo

sys.exit(run_demo(sys.argv[1] if len(sys.argv) > 1 else "s3stream-data"))
