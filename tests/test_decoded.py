"""The decoded-data cache: a source is decoded once, later processes load the stored arrays (verified),
a corrupt copy is named, moved aside and rebuilt, and a changed source file or an unwritable cache never
serves stale or no data."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from bench_stability_gap.harness.data.decoded import decoded, folder_for


@pytest.fixture()
def source(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "source.bin"
    path.write_bytes(b"raw")
    return path


def counting_decoder(calls: list[int]):
    def decode():
        calls.append(1)
        return np.arange(12, dtype=np.uint8).reshape(3, 4), np.array([7, 8, 9], dtype=np.int64)
    return decode


def test_a_source_is_decoded_once_and_loaded_read_only_after(source):
    calls: list[int] = []
    first = decoded("toy", [source], counting_decoder(calls))
    again = decoded("toy", [source], counting_decoder(calls))
    assert calls == [1]  # the second call read the stored arrays
    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a, b) and a.dtype == b.dtype and not b.flags.writeable
    assert (folder_for("toy", [source]) / "meta.json").is_file()


def test_a_corrupt_copy_is_named_moved_aside_and_rebuilt(source):
    calls: list[int] = []
    decoded("toy", [source], counting_decoder(calls))
    folder = folder_for("toy", [source])
    stored = folder / "0.npy"
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF  # one pixel flipped: the header still parses, the sha256 does not match
    stored.write_bytes(bytes(data))
    warned: list[str] = []
    arrays = decoded("toy", [source], counting_decoder(calls), warn=warned.append)
    assert calls == [1, 1] and np.array_equal(arrays[0], np.arange(12).reshape(3, 4))
    assert len(warned) == 1 and str(folder) in warned[0] and "0.npy does not match its sha256" in warned[0]
    assert list(folder.parent.glob(folder.name + ".corrupt-*"))  # kept for a post-mortem, never read again
    assert decoded("toy", [source], counting_decoder(calls)) is not None and calls == [1, 1]


def test_a_changed_source_file_is_decoded_again(source):
    calls: list[int] = []
    decoded("toy", [source], counting_decoder(calls))
    before = folder_for("toy", [source])
    source.write_bytes(b"a new release")
    os.utime(source, ns=(1, 1))
    assert folder_for("toy", [source]) != before
    decoded("toy", [source], counting_decoder(calls))
    assert calls == [1, 1]


def test_an_unwritable_cache_costs_the_decoding_not_the_data(source, tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("BENCH_CACHE_DIR", str(blocked))
    calls: list[int] = []
    warned: list[str] = []
    arrays = decoded("toy", [source], counting_decoder(calls), warn=warned.append)
    assert calls == [1] and np.array_equal(arrays[1], [7, 8, 9])
    assert len(warned) == 1 and "could not store decoded toy" in warned[0] and "decodes it again" in warned[0]


def test_the_embedded_sources_load_from_the_cache_as_they_decode(tmp_path, monkeypatch):
    from bench_stability_gap.harness.data import sources

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    sources._mnist5k_arrays.cache_clear()
    try:
        images, labels = sources._mnist5k_arrays()  # decoded and stored
        sources._mnist5k_arrays.cache_clear()
        cached_images, cached_labels = sources._mnist5k_arrays()  # read back
    finally:
        sources._mnist5k_arrays.cache_clear()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8 and labels.dtype == np.int64
    assert np.array_equal(images, cached_images) and np.array_equal(labels, cached_labels)
    assert list((tmp_path / "cache" / "decoded").glob("mnist5k-*/meta.json"))
