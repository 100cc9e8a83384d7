"""Files named by settings (``REWARDD_API_KEYS_FILE``, ``REWARDD_COMPAT_CONFIG``), read with a
size limit and only when they are regular files.

A setting that points at ``/dev/zero`` used to be read until memory ran out, and one that
points at a FIFO blocked the start for ever: :func:`read_setting_file` opens without blocking,
refuses anything but a regular file, and reads at most :data:`MAX_SETTING_FILE_BYTES` (a
configuration file is kilobytes; 16 MiB leaves room for a key file of thousands of tenants).
Every refusal is one line naming the setting and the file, so ``rewardd serve`` can print it
and exit 2.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_SETTING_FILE_BYTES = 16 * 1024 * 1024
"""Largest file a setting may name."""


class SettingFileInvalid(ValueError):
    """The file a setting names cannot be read as a configuration file (one line)."""


def read_setting_file(path: Path, setting: str,
                      limit: int = MAX_SETTING_FILE_BYTES) -> bytes:
    """The bytes of ``path``, the file setting ``setting`` names; raises
    :class:`SettingFileInvalid` when it cannot be opened, is not a regular file (a device,
    FIFO, socket or directory) or holds more than ``limit`` bytes."""
    where = f"{setting}: file {str(path)!r}"
    try:  # O_NONBLOCK: opening a FIFO with no writer must not wait for one
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SettingFileInvalid(f"{setting}: cannot read file {str(path)!r}: "
                                 f"{exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SettingFileInvalid(f"{where} is not a regular file ({_kind(mode)}); point "
                                 "the setting at a configuration file")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)  # a file that grows while read stops here too
        except OSError as exc:
            raise SettingFileInvalid(f"{setting}: cannot read file {str(path)!r}: "
                                     f"{exc.strerror or exc}") from None
    if len(data) > limit:
        raise SettingFileInvalid(f"{where} is larger than {limit} bytes, the most a "
                                 "configuration file may hold")
    return data


def read_setting_text(path: Path, setting: str,
                      limit: int = MAX_SETTING_FILE_BYTES) -> str:
    """:func:`read_setting_file` decoded as UTF-8 (refused, naming the setting, when not)."""
    data = read_setting_file(path, setting, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingFileInvalid(f"{setting}: file {str(path)!r} is not UTF-8 text (byte "
                                 f"{exc.start})") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


__all__ = ["MAX_SETTING_FILE_BYTES", "SettingFileInvalid", "read_setting_file",
           "read_setting_text"]
