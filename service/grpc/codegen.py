"""Generate the Python code of ``openapi/rewardd/v1/rewardd.proto`` into this package.

The generated modules are committed (``rewardd_pb2.py``, ``rewardd_pb2_grpc.py``) so an
install needs no protoc; ``tests/grpc/test_proto_codegen.py`` regenerates them and fails when
the committed ones are stale, like the OpenAPI document's test. Regenerate with
``python -m rewardd.service.grpc.codegen`` (needs the dev extra's grpcio-tools).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROTO = PACKAGE_DIR.parent.parent / "openapi" / "rewardd" / "v1" / "rewardd.proto"
GENERATED = ("rewardd_pb2.py", "rewardd_pb2_grpc.py")


def generate(proto: Path = PROTO) -> dict[str, str]:
    """{module file name: source} of the generated code, imports made package-relative."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory() as out:
        rc = protoc.main(["grpc_tools.protoc", f"-I{proto.parent}", f"-I{include}",
                          f"--python_out={out}", f"--grpc_python_out={out}", str(proto)])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {proto} (exit {rc})")
        sources = {name: (Path(out) / name).read_text() for name in GENERATED}
    # protoc writes `import rewardd_pb2`, a top-level module; ours lives in this package
    sources["rewardd_pb2_grpc.py"] = re.sub(r"^import rewardd_pb2 as", "from . import rewardd_pb2 as",
                                            sources["rewardd_pb2_grpc.py"], flags=re.M)
    return sources


def main() -> None:
    for name, source in generate().items():
        (PACKAGE_DIR / name).write_text(source)
        print(f"wrote {PACKAGE_DIR / name}", file=sys.stderr)


if __name__ == "__main__":
    main()
