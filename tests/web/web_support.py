"""Helpers for the dashboard's HTTP tests: the operator password, CSRF tokens, login."""

from __future__ import annotations

import re
from html import unescape as html_unescape
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


def form_of(client: TestClient, page: str, action: str) -> dict[str, str]:
    """The hidden fields of the first form on ``page`` that posts to ``action``, as the browser
    would send them, without the CSRF token."""
    html = client.get(page).text
    start = html.index(f'action="{action}"')
    form = html[start : html.index("</form>", start)]
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))
    fields.pop("csrf", None)
    return {k: html_unescape(v) for k, v in fields.items()}


def bulk_form(client: TestClient, page: str, action: str) -> dict[str, str]:
    """The hidden fields of a bulk action's form on ``page``, as the browser would send them
    (the filter, and the count and last run the page showed), without the CSRF token."""
    return form_of(client, page, f"/runs/bulk/{action}")
