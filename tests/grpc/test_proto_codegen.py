"""The committed generated code is what the proto generates now (like openapi.json's test):
edit the proto, then run ``python -m rewardd.service.grpc.codegen``."""

from __future__ import annotations

from rewardd.service.grpc import codegen


def test_committed_generated_code_matches_the_proto():
    for name, source in codegen.generate().items():
        committed = (codegen.PACKAGE_DIR / name).read_text()
        assert committed == source, (
            f"service/grpc/{name} is stale: run `python -m rewardd.service.grpc.codegen`")


def test_the_proto_is_the_rewardd_v1_package():
    text = codegen.PROTO.read_text()
    assert "package rewardd.v1;" in text
    assert codegen.PROTO.relative_to(codegen.PACKAGE_DIR.parent.parent).as_posix() == \
        "openapi/rewardd/v1/rewardd.proto"
