"""SpecRouter: lossless, adaptive, multi-level speculative decoding served over gRPC."""

__version__ = "0.1.0"
