"""The records' CRC-32 (storage/checksum.py) is the standard CRC-32: segment files written by a build with
zlib-ng are read by one without it, and those written before it was used are read by it."""

from __future__ import annotations

import os
import zlib

from hypothesis import given
from hypothesis import strategies as st

from storage import checksum
from storage.segment import HEADER_SIZE, AppendFile, scan


@given(st.binary(max_size=5000), st.integers(min_value=0, max_value=2**32 - 1))
def test_the_checksum_is_zlibs_crc32(data: bytes, start: int) -> None:
    assert checksum.crc32(data) == zlib.crc32(data)
    assert checksum.crc32(data, start) == zlib.crc32(data, start)


def test_the_fast_implementation_is_the_one_installed() -> None:
    # zlib-ng is a declared dependency: the fallback is for platforms without its wheel, not for this one.
    assert checksum.crc32.__module__ != "zlib", checksum.crc32.__module__


def test_records_framed_with_it_scan_clean(tmp_path) -> None:
    f = AppendFile.create(str(tmp_path / "seg"), None)
    payloads = [os.urandom(n) for n in (0, 1, 1024, 70_000)]
    for p in payloads:
        f.append(p)
    f.write_out()
    records, good_end, skipped = scan(f.read_all(), "seg")
    f.close()
    assert skipped == 0 and good_end == sum(len(p) for p in payloads) + HEADER_SIZE * len(payloads)
    assert len(records) == len(payloads)
