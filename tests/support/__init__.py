"""Test support, in one place; production code never imports it.

- :mod:`tests.support.configs`: the small engine ``Config`` most engine tests start from.
- :mod:`tests.support.s3`: the S3 test server from ``S3STREAM_TEST_S3_*``, storage on it, prefix cleanup
  (the ``s3_server``/``s3_prefix`` fixtures in ``tests/conftest.py`` are built on it).
- :mod:`tests.support.backends`: the backend matrix that re-runs the engine suites on S3 and SQLite.
- :mod:`tests.support.storage_contract`, :mod:`tests.support.metadata_contract`: the suites every
  ObjectStorage and MetadataStore implementation passes.
- :mod:`tests.support.faults`: fault-injecting object storage and a flaky HTTP proxy for S3.
- :mod:`tests.support.wal`: a WAL twin a test can make fail or hang.
- :mod:`tests.support.wal_faults`: a block WAL device that drops unsynced writes, tears or fails them.
- :mod:`tests.support.objects`: write record batches as one committed StreamSet object.
- :mod:`tests.support.directio`: whether the WAL's O_DIRECT write paths can run in a directory.
"""
