"""The object format: AutoMQ-compatible data blocks, index block, footer, plus a checksum section.

Layout and worked examples: ``docs/format.md`` sections 2 and 3. The sans-IO core is
``codec`` (the layouts and values), ``block`` (data blocks) and ``tail`` (index block, checksum
section, footer); ``writer``, ``reader`` and ``cache`` do the I/O through the storage protocols.
"""

from s3stream.objectformat.block import decode_block, encode_block
from s3stream.objectformat.cache import ObjectReaderCache
from s3stream.objectformat.codec import ChecksumSection, Footer, IndexEntry, NeedBytes, ObjectTail
from s3stream.objectformat.keys import DEFAULT_NAMESPACE, object_key, parse_object_key
from s3stream.objectformat.reader import DataBlock, FindResult, ObjectReader, RangeSource
from s3stream.objectformat.tail import (
    decode_checksum_section,
    decode_footer,
    decode_index,
    decode_tail,
    encode_checksum_section,
    encode_footer,
    encode_index,
    encode_tail,
)
from s3stream.objectformat.writer import ObjectWriter, WrittenObject, stream_ranges_of

__all__ = [
    "DEFAULT_NAMESPACE",
    "ChecksumSection",
    "DataBlock",
    "FindResult",
    "Footer",
    "IndexEntry",
    "NeedBytes",
    "ObjectReader",
    "ObjectReaderCache",
    "ObjectTail",
    "ObjectWriter",
    "RangeSource",
    "WrittenObject",
    "decode_block",
    "decode_checksum_section",
    "decode_footer",
    "decode_index",
    "decode_tail",
    "encode_block",
    "encode_checksum_section",
    "encode_footer",
    "encode_index",
    "encode_tail",
    "object_key",
    "parse_object_key",
    "stream_ranges_of",
]
