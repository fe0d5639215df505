"""Metadata stores: the MetadataStore protocol, SQLite and in-memory implementations."""
