"""Running the endpoint under uvicorn on a socket bound here (so port 0 works and is reported)."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

import torch
import uvicorn

from infra.settings import HybridflowSettings
from infra.storage.store import open_store
from serving.app import create_app
from serving.connections import DropInvalidRequestLines, guarded_protocol
from serving.holder import ModelHolder
from serving.metrics import ServingMetrics
from serving.online.service import OnlineFeatures
from serving.online.worker import ProcessWorker, ThreadWorker
from serving.refusals import RefusalLog

log = logging.getLogger(__name__)
SWITCH_INTERVAL_S = 0.0005


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: the OS picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP lets asyncio set TCP_NODELAY on accepted connections; without it a
    # response written as headers + body waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    settings: HybridflowSettings,
    host: str | None = None,
    port: int | None = None,
    port_file: Path | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM; in-flight requests finish before the process exits."""
    cfg = settings.serve
    torch.set_num_threads(cfg.torch_threads)
    # the store is read and written in threads (and ingestion's work with INGEST__WORKER=thread):
    # hand the GIL back to the request loop within 0.5 ms (the default 5 ms adds up to that to
    # a /predict waiting behind them)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    metrics = ServingMetrics()
    store = open_store(settings.store)
    holder = ModelHolder(store, metrics)
    online = None
    if cfg.ingest.online:
        process = cfg.ingest.worker == "process"
        worker = (
            ProcessWorker(cfg.ingest.worker_nice, idle=cfg.ingest.worker_idle)
            if process
            else ThreadWorker()
        )
        online = OnlineFeatures(
            store, cfg.ingest, metrics, worker=worker, purchase_event=settings.purchase_event
        )
    app = create_app(holder, cfg, metrics, online)
    sock = bind_socket(host or cfg.host, cfg.port if port is None else port)
    bound_host, bound_port = sock.getsockname()[:2]
    log.info(
        "serving on http://%s:%d (store %s, poll every %.1fs)",
        bound_host,
        bound_port,
        settings.store,
        cfg.poll_interval_s,
    )
    if port_file is not None:
        tmp = port_file.with_name(f".{port_file.name}.tmp")
        tmp.write_text(str(bound_port))
        os.replace(tmp, port_file)
    logging.getLogger("uvicorn.error").addFilter(DropInvalidRequestLines())
    protocol = guarded_protocol(
        metrics,
        cfg.header_timeout_s,
        max_header_bytes=cfg.max_header_bytes,
        max_connections=cfg.max_connections,
        max_connections_per_client=cfg.max_connections_per_client,
        refusals=RefusalLog(cfg.refusal_log_interval_s),
    )
    config = uvicorn.Config(
        app,
        http=protocol,
        timeout_keep_alive=cfg.keep_alive_s,
        lifespan="on",
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    uvicorn.Server(config).run(sockets=[sock])
