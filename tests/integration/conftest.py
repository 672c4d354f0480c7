"""Fixtures the integration tests share."""

from tests.fixtures.moto_s3 import s3_endpoint, s3_store

__all__ = ["s3_endpoint", "s3_store"]
