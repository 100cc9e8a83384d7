"""Files named by settings are read only when regular and small (issue 28 row 16): a setting
pointing at /dev/zero was read until memory ran out, a FIFO blocked the start."""

from __future__ import annotations

import os

import pytest

from rewardd.service.setting_files import (SettingFileInvalid, read_setting_file,
                                           read_setting_text)
from rewardd.workers.settings import MIN_POOL_LIMIT, POOL_PER_CPU, max_pool_size
from rewardd.workers.cpus import usable_cpus
from rewardd.service.settings import Settings


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "keys.json"
    path.write_bytes(b'{"tenants": {}}')
    assert read_setting_file(path, "REWARDD_API_KEYS_FILE") == b'{"tenants": {}}'
    assert read_setting_text(path, "REWARDD_API_KEYS_FILE") == '{"tenants": {}}'


def test_a_file_over_the_limit_is_refused_naming_the_setting(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 101)
    with pytest.raises(SettingFileInvalid, match="REWARDD_COMPAT_CONFIG: file .* is larger "
                       "than 100 bytes"):
        read_setting_file(path, "REWARDD_COMPAT_CONFIG", limit=100)
    path.write_bytes(b" " * 100)
    assert len(read_setting_file(path, "REWARDD_COMPAT_CONFIG", limit=100)) == 100


@pytest.mark.parametrize("special, kind", [("/dev/zero", "a character device"),
                                           ("/tmp", "a directory")])
def test_a_device_or_directory_is_refused_without_reading(special, kind):
    with pytest.raises(SettingFileInvalid, match=f"is not a regular file \\({kind}\\)"):
        read_setting_file(special, "REWARDD_COMPAT_CONFIG")


def test_a_fifo_without_a_writer_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(SettingFileInvalid, match="a FIFO"):
        read_setting_file(fifo, "REWARDD_API_KEYS_FILE")


def test_a_missing_or_binary_file_is_one_line_naming_the_setting(tmp_path):
    with pytest.raises(SettingFileInvalid, match="REWARDD_API_KEYS_FILE: cannot read file"):
        read_setting_file(tmp_path / "absent", "REWARDD_API_KEYS_FILE")
    binary = tmp_path / "compat.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(SettingFileInvalid, match="is not UTF-8 text"):
        read_setting_text(binary, "REWARDD_COMPAT_CONFIG")


def test_the_pool_size_is_bounded_relative_to_the_cpus():
    limit = max_pool_size()
    assert limit == max(MIN_POOL_LIMIT, POOL_PER_CPU * usable_cpus())
    assert Settings(pool_size=limit).pool_size == limit
    with pytest.raises(ValueError, match=f"at most {limit} here"):
        Settings(pool_size=100_000)
    assert Settings().pool_size == usable_cpus()  # the default is always accepted
