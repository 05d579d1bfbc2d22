"""Logging in to the console from tests: a user of a role added to the store, and a
test client logged in as it, with the CSRF token its forms carry."""

from __future__ import annotations

import re
import warnings
from typing import Any

from messagebox import MessageBox
from messagebox.errors import UnknownUser

with warnings.catch_warnings():  # starlette 1.x prefers httpx2, and warns with httpx
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

PASSWORD = "correct horse battery"
"""Every test user's password (strong enough for ``add_user``)."""
COOKIE = "mb_session"


def ensure_user(box: MessageBox, name: str, role: str, password: str = PASSWORD) -> None:
    """The user ``name`` with ``role`` (added, or its role set)."""
    try:
        box.user(name)
    except UnknownUser:
        box.add_user(name, role, password)
    else:
        box.set_user_role(name, role)


def login(
    client: TestClient, box: MessageBox, name: str, role: str, *, page: str = "/failures"
) -> str:
    """Log ``client`` in as the user ``name`` (added with ``role`` when missing); the
    CSRF token of its forms (read from ``page``)."""
    ensure_user(box, name, role)
    done = client.post("/login", data={"user": name, "password": PASSWORD, "next": page})
    assert done.status_code == 303, done.text
    assert COOKIE in client.cookies
    return csrf_of(client.get(page).text)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


def browser(box: MessageBox, **options: Any) -> TestClient:
    """A browser of a console made with ``options``, as served by default."""
    from messagebox.console import create_app

    return TestClient(
        create_app(box, **options), base_url="http://127.0.0.1:8080", follow_redirects=False
    )
