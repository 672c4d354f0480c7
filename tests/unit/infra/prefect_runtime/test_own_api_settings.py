"""The client settings for the API a command found or started itself (warm or temporary)."""

from __future__ import annotations

from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_CLIENT_CSRF_SUPPORT_ENABLED,
    PREFECT_SERVER_CSRF_PROTECTION_ENABLED,
    PREFECT_UI_URL,
    temporary_settings,
)

from infra.prefect_runtime.api import own_api_settings

URL = "http://127.0.0.1:4321/api"


def test_the_client_skips_the_csrf_token_a_server_without_the_protection_never_issues():
    with temporary_settings(updates={PREFECT_SERVER_CSRF_PROTECTION_ENABLED: False}):
        updates = own_api_settings(URL)
    assert updates == {
        PREFECT_API_URL: URL,
        PREFECT_UI_URL: "",
        PREFECT_CLIENT_CSRF_SUPPORT_ENABLED: False,
    }


def test_a_server_started_with_csrf_protection_keeps_the_clients_tokens():
    with temporary_settings(updates={PREFECT_SERVER_CSRF_PROTECTION_ENABLED: True}):
        updates = own_api_settings(URL)
    assert PREFECT_CLIENT_CSRF_SUPPORT_ENABLED not in updates
    assert updates[PREFECT_API_URL] == URL
