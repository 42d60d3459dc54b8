"""Generated protobuf and gRPC code for `proto/specrouter/v1/` (regenerate with `python -m specrouter.protogen`)."""
