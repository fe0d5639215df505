"""Key rules shared by every backend: any string is a valid key or the one documented error, a
valid key never names a path outside the local root, and every start of a valid key is a valid
listing prefix."""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from hypothesis import given, settings
from hypothesis import strategies as st

from s3stream.errors import InvalidArgumentError
from s3stream.storage.keys import KEY_CHARS, validate_key, validate_prefix

segment = st.text(alphabet=sorted(KEY_CHARS), min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))
valid_keys = st.lists(segment, min_size=1, max_size=6).map("/".join)
nasty = st.lists(st.sampled_from([*"./\\~ \x00\x01\n:%", "..", "ü", *"ab"]), max_size=20).map("".join)


@settings(deadline=None)
@given(st.one_of(st.text(max_size=40), nasty))
def test_any_string_is_a_key_or_invalid_argument(text: str) -> None:
    try:
        assert validate_key(text) == text
    except InvalidArgumentError:
        return


@settings(deadline=None)
@given(st.one_of(st.text(max_size=40), nasty))
def test_any_string_is_a_prefix_or_invalid_argument(text: str) -> None:
    try:
        assert validate_prefix(text) == text
    except InvalidArgumentError:
        return


@settings(deadline=None)
@given(st.one_of(valid_keys, nasty))
def test_valid_keys_stay_inside_the_root(key: str) -> None:
    try:
        validate_key(key)
    except InvalidArgumentError:
        return
    root = PurePosixPath("/root")
    joined = PurePosixPath(os.path.normpath(root.joinpath(*key.split("/"))))
    assert joined.is_relative_to(root)
    assert joined != root
    assert str(joined.relative_to(root)) == key


@settings(deadline=None)
@given(valid_keys)
def test_every_start_of_a_valid_key_is_a_valid_prefix(key: str) -> None:
    for end in range(len(key) + 1):
        validate_prefix(key[:end])
