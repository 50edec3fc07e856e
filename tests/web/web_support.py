"""Helpers for the dashboard's HTTP tests: the operator password, CSRF tokens, login."""

from __future__ import annotations

import re
from typing import Any

from starlette.testclient import TestClient

PASSWORD = "correct horse battery"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(client: TestClient, path: str = "/login") -> str:
    found = _CSRF.search(client.get(path).text)
    assert found, f"no CSRF token on {path}"
    return found.group(1)


def login(client: TestClient, name: str = "alice") -> str:
    """Log in as an operator; returns the new session's CSRF token."""
    response = client.post(
        "/login", data={"csrf": csrf_of(client), "name": name, "password": PASSWORD}, follow_redirects=False
    )
    assert response.status_code == 303, response.text
    return csrf_of(client, "/")


def post(client: TestClient, path: str, csrf: str, **fields: Any) -> Any:
    return client.post(path, data={"csrf": csrf, **fields}, follow_redirects=False)
