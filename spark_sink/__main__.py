"""``python -m spark_sink [DATA_DIR]``: the demo Structured Streaming job (the README's main job).

``python -m spark_sink abandon ...``: the operator tool (:mod:`spark_sink.cli`).
"""

import sys

if sys.argv[1:2] == ["abandon"]:
    from spark_sink.cli import main

    sys.exit(main(sys.argv[1:]))

from spark_sink.demo import run_demo

sys.exit(run_demo(sys.argv[1] if len(sys.argv) > 1 else "s3stream-data"))
