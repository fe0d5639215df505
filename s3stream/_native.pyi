from s3stream.record import StreamRecordBatch

def configure(cls: type[StreamRecordBatch], /) -> None: ...
def decode_block(
    buf: bytes | bytearray | memoryview,
    pos: int,
    stream_id: int,
    start_offset: int,
    end_offset: int,
    record_count: int,
    size_bytes: int,
    exact: bool,
    /,
) -> tuple[tuple[StreamRecordBatch, ...], bool, int | None] | None: ...
def check_batches(
    batches: list[StreamRecordBatch], last_stream: int, last_end: int, payload_max: int, /
) -> bool: ...
def encode_run(
    scratch: bytearray,
    batches: list[StreamRecordBatch],
    i: int,
    n: int,
    stream_id: int,
    block_bytes: int,
    start_offset: int,
    payload_bytes: int,
    threshold: int,
    /,
) -> tuple[int, int, int, int]: ...
def kafka_records(
    keys: object,
    values: object,
    timestamps_ms: object,
    headers: object,
    first_ts: object,
    header_size: int,
    /,
) -> bytearray | None: ...
def encode_columns_run(
    scratch: bytearray,
    bases: object,
    payloads: list[bytes],
    end: int,
    i: int,
    n: int,
    stream_id: int,
    epoch: int,
    block_bytes: int,
    start_offset: int,
    payload_bytes: int,
    threshold: int,
    payload_max: int,
    /,
) -> tuple[int, int, int, int, bool]: ...
def kafka_decode_records(
    body: bytes, count: int, base: int, first_ts: int, append_time: int | None, /
) -> (
    tuple[list[int], list[int], list[bytes | None], list[bytes | None], list[list[tuple[str, bytes | None]]]]
    | None
): ...
