"""Routes Gradio serves without its login check, guarded when the app runs with --auth.

Gradio 6 registers `POST /gradio_api/cancel` without the `login_check` dependency its other
routes have, so on a server behind a login anyone who could reach the port, and who knew (or
saw) a job's session hash and event id, could cancel that job. This ASGI middleware answers 401
there unless the request carries a valid login cookie, checked the way Gradio checks it (its
access-token cookie looked up in the app's tokens). Without --auth there is no login to check:
the route stays open, as the whole app is (see docs/app.md).
"""
from __future__ import annotations

import json

GUARDED_SUFFIXES = ("/cancel",)


def _cookies(scope) -> dict[str, str]:
    from http.cookies import SimpleCookie

    jar = SimpleCookie()
    for name, value in scope.get("headers") or []:
        if name == b"cookie":
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # noqa: BLE001 - a malformed cookie header is no login
                pass
    return {k: m.value for k, m in jar.items()}


def logged_in(scope) -> bool:
    """Whether the request carries a login Gradio issued (False when that cannot be told)."""
    app = scope.get("app")
    tokens, cookie_id = getattr(app, "tokens", None), getattr(app, "cookie_id", None)
    if tokens is None or cookie_id is None:
        return False  # fail closed: a Gradio that keeps logins elsewhere gets no open cancel
    cookies = _cookies(scope)
    token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
    return token is not None and tokens.get(token) is not None


class LoginForUnguardedRoutes:
    """ASGI middleware: 401 on the routes Gradio leaves open, unless logged in."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") == "http" and scope.get("path", "").rstrip("/").endswith(GUARDED_SUFFIXES) \
                and not logged_in(scope):
            body = json.dumps({"detail": "Not authenticated"}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
