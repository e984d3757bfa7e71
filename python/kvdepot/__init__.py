"""kvdepot: the KV-cache connector for vLLM (kvdepot.vllm) over the C library
libkvdepot.so (kvdepot._lib). Stdlib only; the engine brings torch."""

from kvdepot._lib import KvdepotError

__all__ = ["KvdepotError"]
__version__ = "0.1.0"
