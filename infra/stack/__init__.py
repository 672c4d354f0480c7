"""The local deployed-mode stack: Prefect server, cpu-pool/gpu-pool workers, optional S3."""
