"""Benchmark: per-token advantages over gRPC against REST and the in-process call (issue 19).

A large trainer batch: 1024 groups x 16 rollouts x 1024 tokens (16.8 M tokens), rewards
precomputed (``Advantages`` / ``POST /v1/advantages``, grpo), to a real ``rewardd serve
--grpc-port``. Measured, each a whole round trip as a trainer pays it (the client's encode,
the server's decode, validation, compute and encode, the transfer, the client's decode to
arrays or lists):

- in-process: the server's own work on the body (validate + ``pipeline.advantages``, GC
  paused as served), dense output: what a trainer pays calling the library without a server;
- gRPC dense: one ``RaggedFloat32`` (float32 little-endian bytes + row offsets), decoded with
  ``np.frombuffer``;
- gRPC rle: ``RaggedRle`` (parallel arrays of float64 values, lengths, row offsets);
- REST msgpack rle and REST JSON dense through ``rewardd_client`` (bench_advantages'
  round trip).

Bytes are the response's on the wire (protobuf message size; HTTP body). Variants run
interleaved in each repeat (shared machines drift); medians are reported with the ratio to
the in-process call. Target (issue 19): gRPC dense within 2x of in-process.

Run: `.venv/bin/python tests/benchmarks/bench_grpc.py [--groups N --rollouts N --tokens N
--repeats N]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd.service.grpc import rewardd_pb2 as pb  # noqa: E402
from rewardd.service.grpc import rewardd_pb2_grpc as pb_grpc  # noqa: E402
from rewardd.service.grpc.convert import fill  # noqa: E402
from tests.benchmarks.bench_advantages import (http_call, in_process,  # noqa: E402
                                                make_request)
from tests.support.server import free_port, running_server  # noqa: E402

COMMAND = ".venv/bin/python tests/benchmarks/bench_grpc.py"


def grpc_call(stub: pb_grpc.RewarddStub, data: dict[str, Any]) -> Callable[[], int]:
    message = fill(pb.AdvantagesRequest(), data)

    def call() -> int:
        reply = stub.Advantages(message, timeout=600)
        values = reply.advantages
        if values.WhichOneof("values") == "dense":
            dense = np.frombuffer(values.dense.data_f32le, dtype="<f4")
            offsets = np.asarray(values.dense.row_offsets)
            assert dense.size == offsets[-1]
        else:
            lengths = np.asarray(values.rle.lengths)
            assert np.asarray(values.rle.values).size == lengths.size
        return reply.ByteSize()
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shape = (args.groups, args.rollouts, args.tokens)
    print(f"$ {COMMAND} --groups {args.groups} --rollouts {args.rollouts} "
          f"--tokens {args.tokens} --repeats {args.repeats}", flush=True)
    dense, rle = make_request(*shape, "dense"), make_request(*shape, "rle")
    port = free_port()
    with running_server("--pool-size", "1", "--grpc-port", str(port)) as url, \
            grpc.insecure_channel(f"127.0.0.1:{port}", options=[
                ("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1)]) as channel:
        stub = pb_grpc.RewarddStub(channel)
        calls: dict[str, Callable[[], Any]] = {
            "in-process (dense)": lambda: in_process(dense),
            "gRPC dense RaggedFloat32": grpc_call(stub, dense),
            "gRPC rle RaggedRle": grpc_call(stub, rle),
            "REST msgpack rle": http_call(url, rle, "msgpack"),
            "REST JSON dense": http_call(url, dense, "json"),
        }
        sizes = {label: call() for label, call in calls.items()}  # warm-up, and the bytes
        times: dict[str, list[float]] = {label: [] for label in calls}
        for _ in range(args.repeats):
            for label, call in calls.items():
                start = time.perf_counter()
                call()
                times[label].append(time.perf_counter() - start)
    base = statistics.median(times["in-process (dense)"])
    tokens = args.groups * args.rollouts * args.tokens
    print(f"\nAdvantages, {args.groups} groups x {args.rollouts} rollouts x {args.tokens} "
          f"tokens ({tokens:,} tokens, grpo), median of {args.repeats} interleaved repeats\n")
    print("| path | median ms | vs in-process | response bytes |")
    print("|---|---:|---:|---:|")
    for label, samples in times.items():
        seconds = statistics.median(samples)
        size = "" if label.startswith("in-process") else f"{sizes[label]:,}"
        print(f"| {label} | {1000 * seconds:.0f} | {seconds / base:.2f}x | {size} |")


if __name__ == "__main__":
    main()
