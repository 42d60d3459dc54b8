"""The checked-in generated code must be exactly what `python -m specrouter.protogen` produces."""

from pathlib import Path

from specrouter import protogen


def test_generated_code_matches_proto_files(tmp_path: Path) -> None:
    fresh = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in protogen.generate(tmp_path)}
    checked_in = {
        p.relative_to(protogen.PYTHON_ROOT).as_posix(): p.read_bytes() for p in protogen.generated_files()
    }
    assert sorted(checked_in) == sorted(fresh), "generated files differ: run `python -m specrouter.protogen`"
    stale = [name for name in fresh if fresh[name] != checked_in[name]]
    assert not stale, f"{stale} drifted from proto/: run `python -m specrouter.protogen` and commit the result"


def test_every_proto_is_in_the_mirrored_package() -> None:
    for proto in protogen.proto_files():
        rel = proto.relative_to(protogen.PROTO_ROOT)
        assert rel.parts[:2] == ("specrouter", "v1"), f"{rel} must live under proto/specrouter/v1/"
        text = proto.read_text()
        assert "package specrouter.v1;" in text, f"{rel} must declare `package specrouter.v1;`"


def test_generated_stubs_import() -> None:
    from specrouter.v1 import worker_pb2, worker_pb2_grpc

    assert worker_pb2.InfoResponse(model_name="m").model_name == "m"
    assert hasattr(worker_pb2_grpc, "WorkerServiceStub")
