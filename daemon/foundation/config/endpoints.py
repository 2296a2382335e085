"""Whether a notify endpoint's URL and token (values from .env) can be sent to at all.

``[notify]`` names .env keys (``url_env``, ``token_env``); their values are only known once
the .env is read, so the schema cannot judge them. :func:`endpoint_problems` does, the same
function at ``check`` (NOT READY, exit 3), at the start of ``run`` (exit 3) and at a SIGHUP
reload (refused whole). A value httpx would refuse at send time (a port out of range, an
unclosed IPv6 bracket, a doubled port, a non-ASCII token, a newline) is found here, before
any page, instead of crashing the delivery worker at the first one.

Every problem is one line naming the .env file and the key, never the value (a webhook URL
is a credential: Slack's carries its secret in the path).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from shoprld.daemon.foundation.config.configsections import NotifySection
from shoprld.daemon.foundation.config.secrets import Secrets

# Longer than any real webhook URL or token; a longer value is a paste gone wrong.
MAX_URL_LEN = 4096
MAX_TOKEN_LEN = 4096
# RFC 9110 token68-ish: what a bearer token may hold in a header (visible ASCII, no space).
_TOKEN = re.compile(r"[\x21-\x7e]+")
# Visible ASCII only: no space, no control character, nothing non-ASCII (IDNs: use punycode).
_URL_CHARS = re.compile(r"[\x21-\x7e]+")


def url_problem(value: str) -> str | None:
    """Why ``value`` is not an http(s) URL a request can be sent to; None when it is. The
    reason never quotes the value."""
    if not value:
        return "is empty"
    if len(value) > MAX_URL_LEN:
        return f"is {len(value)} characters long (at most {MAX_URL_LEN})"
    if not _URL_CHARS.fullmatch(value):
        return "holds a space, a control character or a non-ASCII character"
    try:
        parts = urlsplit(value)
        port = parts.port  # raises for a port out of range or not a number (host:80:80)
        host = parts.hostname
    except ValueError as exc:
        reason = "an unclosed [ in the host" if "IPv6" in str(exc) else "a port that is not a number from 0 to 65535"
        return f"is not a valid URL ({reason})"
    if parts.scheme not in ("http", "https"):
        return "does not start with http:// or https://"
    if not host:
        return "has no host"
    if port == 0:
        return "has port 0"
    try:
        # httpx's own parser is the one that will send it: it must agree.
        url = httpx.URL(value)
        httpx.Request("POST", url)
    except Exception as exc:  # httpx.InvalidURL and friends: whatever it refuses, refused here
        return f"is not a URL httpx can send to ({type(exc).__name__})"
    if not url.host:
        return "has no host"
    return None


def token_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as ``Authorization: Bearer <value>``; None when it can."""
    if len(value) > MAX_TOKEN_LEN:
        return f"is {len(value)} characters long (at most {MAX_TOKEN_LEN})"
    if not _TOKEN.fullmatch(value):
        return "holds a space, a control character or a non-ASCII character (a header value must be visible ASCII)"
    return None


def endpoint_problems(section: NotifySection, secrets: Secrets, env_file: Path | None) -> list[str]:
    """One line per endpoint whose URL or token cannot be sent to: ``<env file>: <KEY>
    (notify.endpoints[i].url_env): <why>; fix: ...``. A key that is not set at all is
    :meth:`Secrets.require`'s to report, not this."""
    out: list[str] = []
    where = env_file if env_file is not None else ".env"
    for i, ep in enumerate(section.endpoints):
        url = secrets.values.get(ep.url_env, "")
        if url:
            why = url_problem(url)
            if why:
                out.append(f"{where}: {ep.url_env} (notify.endpoints[{i}].url_env) {why}; fix: set it to the "
                           f"receiver's full http:// or https:// URL (ASCII, host and a port from 1 to 65535)")
        token = secrets.values.get(ep.token_env, "") if ep.token_env else ""
        if token:
            why = token_problem(token)
            if why:
                out.append(f"{where}: {ep.token_env} (notify.endpoints[{i}].token_env) {why}; fix: paste the "
                           f"token exactly as the service shows it, without quotes or spaces")
    return out
