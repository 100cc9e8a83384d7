"""rewardd.v1 over gRPC, served beside REST by the same process and event loop.

The proto (``openapi/rewardd/v1/rewardd.proto``) mirrors the pydantic contract field for field.
Every call converts its message to the REST body (:mod:`.convert`), validates it with the
same models and runs the same functions the REST routes call; errors become
``google.rpc.Status`` (:mod:`.errors`). Generated code: ``rewardd_pb2*.py`` (:mod:`.codegen`).
"""
