#!/usr/bin/env python
"""Liveness probe of a `rewardd worker` pod: is this pod's worker still beating?

Every `rewardd worker` main process writes a heartbeat to Redis each
REWARDD_WORKER_HEARTBEAT_S (rewardd.workers.liveness: its name, ``rewardd-<pid>@<host>``, scored
by the time of its last beat in the ``WORKERS_KEY`` zset). This probe reads that zset and
passes when a worker of this host (the pod's hostname) beat within ``--max-age`` seconds
(default: REWARDD_WORKER_LOST_AFTER_S, the age at which the API and the reaper already treat
the worker as dead and requeue what it held).

Why not ``celery inspect ping``: it broadcasts through the broker and waits for every
worker's reply (seconds, and load on Redis from every pod every period), and it answers from
the consumer thread even while the main process is wedged. The heartbeat is what the rest of
the system trusts, so the kubelet restarts exactly the workers the reaper has given up on.

Redis unreachable is *not* a failure here (exit 0, one line on stderr): restarting every
worker because Redis blinked would turn a broker outage into a fleet-wide restart; the API's
/readyz and the alert rules report the outage instead.

Exit codes: 0 alive (or Redis unreachable), 1 no recent heartbeat from this host.

It imports redis and the standard library only, not rewardd: importing ``rewardd.workers``
loads every verifier and torch (about 4 s of CPU on a busy node, every probe period, in every
pod). So it reads its two settings from the environment itself and names the zset itself;
tests/deploy/test_images.py holds both to rewardd's own (``WORKERS_KEY``, the default of
``worker_lost_after_s``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import redis

WORKERS_KEY = "rewardd-workers"
"""rewardd.workers.liveness.WORKERS_KEY"""
LOST_AFTER_S = 6.0
"""Default of REWARDD_WORKER_LOST_AFTER_S (rewardd.workers.settings)."""


def newest_beat(client: redis.Redis, host: str) -> float | None:
    """Time of the latest heartbeat of any worker process named ``...@host``."""
    suffix = f"@{host}"
    beats = [score for name, score in client.zrange(WORKERS_KEY, 0, -1, withscores=True)
             if name.decode(errors="replace").endswith(suffix)]
    return max(beats) if beats else None


def main(argv: list[str] | None = None) -> int:
    broker_url = os.environ.get("REWARDD_BROKER_URL")
    lost_after_s = float(os.environ.get("REWARDD_WORKER_LOST_AFTER_S") or LOST_AFTER_S)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-age", type=float, default=lost_after_s,
                        help="seconds since this host's last heartbeat (default: "
                             "REWARDD_WORKER_LOST_AFTER_S)")
    parser.add_argument("--host", default=socket.gethostname(),
                        help="worker host name (default: this pod's hostname)")
    args = parser.parse_args(argv)
    if not broker_url:
        print("rewardd-worker-probe: REWARDD_BROKER_URL is not set", file=sys.stderr)
        return 1
    client = redis.Redis.from_url(broker_url, socket_timeout=2.0,
                                  socket_connect_timeout=2.0)
    try:
        beat = newest_beat(client, args.host)
    except redis.RedisError as exc:
        print(f"rewardd-worker-probe: Redis unreachable ({exc}); not failing the worker for "
              "it", file=sys.stderr)
        return 0
    if beat is None:
        print(f"rewardd-worker-probe: no heartbeat from a worker on {args.host}",
              file=sys.stderr)
        return 1
    age = time.time() - beat
    if age > args.max_age:
        print(f"rewardd-worker-probe: last heartbeat from {args.host} {age:.1f} s ago "
              f"(limit {args.max_age:g} s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
