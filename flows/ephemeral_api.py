"""Start Prefect's temporary API early, while the caller imports flows and boots the JVM.

Without a configured ``PREFECT_API_URL`` the first flow call starts a temporary API server in a
subprocess and waits for it (10-20 s on a 2-core box): the longest fixed cost of ``hybridflow
run``. Started on a thread at the top of the command, that wait overlaps the imports and Spark's
start instead of following them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


def start_ephemeral_api_in_background() -> Callable[[], None]:
    """Start the temporary API on a daemon thread when no API is configured; the returned
    function waits until it answers (call it before the first flow). A failure is only logged
    here: the first flow call starts the server again and reports it."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return lambda: None

    def start() -> None:
        from prefect.server.api.server import SubprocessASGIServer

        try:
            SubprocessASGIServer().start()  # the instance the first flow call will find
        except Exception as exc:
            log.debug("background start of the temporary Prefect API failed: %s", exc)

    thread = threading.Thread(target=start, name="prefect-api-start", daemon=True)
    thread.start()
    return thread.join
