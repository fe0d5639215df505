"""The direct path's row digest: an order-independent checksum of a task's rows per topic partition.

Both passes of a direct micro-batch see the rows of one (Spark partition, topic partition) and must
see the same rows: the count pass fixes their offsets, the write pass encodes them. Equal counts do
not prove equal rows (a non-deterministic recompute of a lost cache block can give as many rows with
other values), so each row carries a 64-bit hash (:data:`DIGEST_COLUMN`, Spark's ``xxhash64`` over the
row's normalized columns, added once before the micro-batch is persisted) and each pass sums them.

The digest of a set of rows is the exact integer sum of their hashes read as unsigned 64-bit values:
order-independent (rows arrive in any order and Arrow batch boundaries fall anywhere), additive
(partial sums of any split add up to the whole) and, unlike an XOR, it changes when a row is
duplicated. It is a checksum against accidental change, not a cryptographic commitment. The count
pass computes it inside the JVM as two sums of 32-bit halves (``sum(h & 0xFFFFFFFF)`` and
``sum(h >>> 32)``; a JVM ``bigint`` sum cannot overflow below 2^31 rows per task and partition);
:func:`digest_from_halves` joins them to the same integer the write pass gets from
:func:`rows_digest`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

DIGEST_COLUMN = "__s3s_digest"
"""The per-row hash column (``bigint``) the direct path adds to the normalized rows."""
_LOW_MASK = 0xFFFFFFFF
HALF_BITS = 32


def digest_from_halves(low_sum: int, high_sum: int) -> int:
    """The digest from the sums of the hashes' low and high 32-bit halves."""
    return low_sum + (high_sum << HALF_BITS)


def rows_digest(hashes: pa.Array | pa.ChunkedArray) -> int:
    """The digest of rows whose :data:`DIGEST_COLUMN` values are ``hashes`` (int64, no nulls).

    Sums the halves in ``uint64``: each is below 2^32, so no sum overflows below 2^32 rows per call.
    """
    values = np.asarray(hashes.to_numpy(zero_copy_only=False), dtype=np.int64).view(np.uint64)
    low = int(np.bitwise_and(values, np.uint64(_LOW_MASK)).sum(dtype=np.uint64))
    high = int(np.right_shift(values, np.uint64(HALF_BITS)).sum(dtype=np.uint64))
    return digest_from_halves(low, high)
