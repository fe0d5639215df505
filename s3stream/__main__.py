import sys

from s3stream.cli import main

sys.exit(main())
