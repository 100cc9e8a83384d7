"""A private ``redis-server`` on a free port, for tests that restart or kill Redis.

The shared Redis at 6379 must never be restarted by a test; these start their own (with or
without AOF persistence) in a temporary directory and stop it at the end.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """``redis-server`` on 127.0.0.1:``port``; ``aof`` turns on appendonly (fsync every
    second), otherwise nothing persists across a restart."""

    def __init__(self, aof: bool = False) -> None:
        self.aof = aof
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rewardd-redis-"))
        self.proc: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> RedisServer:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--save", "", "--daemonize", "no",
                "--maxmemory-policy", "noeviction"]
        args += (["--appendonly", "yes", "--appendfsync", "everysec"] if self.aof
                 else ["--appendonly", "no"])
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on {self.port}")
                time.sleep(0.05)
        client.close()
        return self

    def kill(self) -> None:
        """SIGKILL: what is not persisted is gone (AOF everysec keeps all but the last
        second)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def restart(self, down_s: float = 0.5) -> float:
        """Kill, wait ``down_s``, start again on the same port; returns seconds it was down."""
        stopped = time.monotonic()
        self.kill()
        time.sleep(down_s)
        self.start()
        return time.monotonic() - stopped

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
