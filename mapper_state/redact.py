"""Hiding secrets: in messages, in URIs, and in the command line kept in the store.

A leaf that everything may import: the log uses it for every line, the settings
use it to find the secrets in force, and the lease and history records use it for
the command line they keep.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

MASK = "***"
_USERINFO = re.compile(r"^(?P<scheme>[a-zA-Z][\w+.-]*)://(?P<userinfo>[^@/]*)@")
#: libpq takes passwords as query parameters too: ``postgresql://host/db?password=...``
_QUERY_SECRET = re.compile(r"[?&](?:password|sslpassword)=(?P<value>[^&#]*)")
#: An option or variable whose name says its value is a secret.
SECRET_NAME = re.compile(
    r"(secret|password|passwd|token|key_id|access_key|api_key|connection_string|credential)",
    re.I,
)
#: Schemes whose bare user-info (no ``:``) is a user name, not a key.
_USER_NAME_SCHEMES = frozenset({"postgresql", "postgres"})


#: The secrets in force in this process (:func:`remember`), for what has no settings at hand.
_known: list[str] = []


def remember(secrets: Iterable[str]) -> None:
    """Make ``secrets`` the ones :func:`redact_known` hides (the command line configures them)."""
    _known[:] = sorted({s for s in secrets if s}, key=len, reverse=True)


def redact_known(text: str) -> str:
    """``text`` with every secret in force in this process replaced by ``***``."""
    return redact(text, _known)


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret in ``text`` by ``***``."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    return text


def uri_secrets(uri: str) -> list[str]:
    """Passwords embedded in a URI: its user-info (``scheme://user:password@host``, or a bare
    ``s3://KEY@bucket``) and libpq's ``password`` query parameters, as typed and decoded."""
    found = [m.group("value") for m in _QUERY_SECRET.finditer(uri or "") if m.group("value")]
    m = _USERINFO.match(uri or "")
    if m:
        _, colon, password = m.group("userinfo").partition(":")
        if password:
            found.append(password)
        elif not colon and m.group("scheme").lower() not in _USER_NAME_SCHEMES:
            found.append(m.group("userinfo"))
    return [*found, *(unquote(s) for s in found if unquote(s) != s)]


def display_uri(uri: str) -> str:
    """A URI with its user-info hidden."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}://{MASK}@", uri or "")


def flag_secrets(args: Sequence[str]) -> list[str]:
    """The values a command line passes to options named like secrets: ``--password X``,
    ``--api-token=X``, ``AWS_SECRET_ACCESS_KEY=X``, and the passwords in its URIs."""
    found: list[str] = []
    for i, arg in enumerate(args):
        name, sep, value = arg.partition("=")
        if SECRET_NAME.search(name):
            if sep:
                found.append(value)
            elif arg.startswith("-") and i + 1 < len(args):
                found.append(args[i + 1])
        found.extend(uri_secrets(value if sep else arg))
    return [f for f in found if f]
