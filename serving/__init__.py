"""The real-time inference endpoint: FastAPI app, hot-reloading model holder, metrics."""
