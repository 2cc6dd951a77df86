"""A real inference server for calibration: torch models behind the Open Inference Protocol
(KServe v2 / Triton HTTP), with a dynamic batcher, Redis features and Prometheus metrics."""
