"""The object format: AutoMQ-compatible data blocks, index block, footer, plus a checksum section."""
