"""The page's sign-in: `GET /signin` (a form for a `read` token), `POST /signin` (sets the
session cookie, see `bridge.fleet.auth`), `POST /signout` (clears it).

A form rather than HTTP Basic so that the browser holds only a cookie it cannot hand to a
script (HttpOnly) nor send from another site (SameSite=Strict), with a bounded lifetime.
"""

from __future__ import annotations

import html
import logging
import time
from typing import Final

from aiohttp import web

from bridge.fleet.auth import COOKIE, SIGN_IN, SIGN_OUT, AccessGuard, too_many

log = logging.getLogger("bridge.fleet.auth")

#: Bytes of a sign-in form, at most (a token and a path).
MAX_FORM: Final = 8192

_FORM: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in - maintenance fleet</title>
<link rel="stylesheet" href="/static/dashboard.css"></head>
<body><main class="signin"><h1>Maintenance fleet</h1>
<form method="post" action="/signin">
<p>{message}</p>
<label for="token">Token of a credential with the <code>read</code> scope</label>
<input id="token" name="token" type="password" autocomplete="current-password" required>
<input type="hidden" name="next" value="{next}">
<button type="submit">Sign in</button>
</form></main></body></html>
"""


def _next(value: str) -> str:
    """Where to go after signing in: a path on this service only (never another site)."""
    if value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/"


def _form(message: str, target: str, status: int = 200) -> web.Response:
    body = _FORM.format(message=html.escape(message), next=html.escape(_next(target)))
    return web.Response(
        text=body,
        status=status,
        content_type="text/html",
        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"},
    )


class SignInRoutes:
    """The sign-in form and the session cookie of one `AccessGuard`."""

    def __init__(self, guard: AccessGuard) -> None:
        self.guard = guard

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(SIGN_IN, self.form)
        app.router.add_post(SIGN_IN, self.sign_in)
        app.router.add_post(SIGN_OUT, self.sign_out)

    async def form(self, request: web.Request) -> web.Response:
        return _form("Sign in to see the fleet.", request.query.get("next", "/"))

    async def sign_in(self, request: web.Request) -> web.Response:
        limiter = self.guard.limiter
        wait = limiter.retry_after(request.remote)
        if wait is not None:
            return too_many(wait)
        if request.content_length is None or request.content_length > MAX_FORM:
            return _form("The form is too large.", "/", status=413)
        form = await request.post()
        token, target = form.get("token"), form.get("next", "/")
        target = target if isinstance(target, str) else "/"
        holder = self.guard.book.find(token) if isinstance(token, str) and token else None
        if holder is None or "read" not in holder.scopes:
            limiter.failed(request.remote, "signin")
            log.warning("sign-in from %s refused", request.remote)
            return _form("That token is not a read credential.", target, status=401)
        response = web.HTTPSeeOther(_next(target))
        response.set_cookie(
            COOKIE,
            self.guard.sessions.issue(holder, time.time()),
            max_age=int(self.guard.sessions.lifetime),
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )
        log.info("sign-in of %s from %s", holder.name, request.remote)
        raise response

    async def sign_out(self, _request: web.Request) -> web.Response:
        response = web.HTTPSeeOther(SIGN_IN)
        response.del_cookie(COOKIE, path="/")
        raise response
