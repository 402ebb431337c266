"""Hiding secrets: in messages, in URIs, and in the command line kept in the store.

A leaf that everything may import: the log uses it for every line, the settings
use it to find the secrets in force, and the lease and history records use it for
the command line they keep.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
_USERINFO = re.compile(r"^(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<userinfo>[^@/]*)@")


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret in ``text`` by ``***``."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    return text


def uri_secrets(uri: str) -> list[str]:
    """Passwords embedded in a URI's user-info (``scheme://user:password@host``)."""
    m = _USERINFO.match(uri or "")
    if not m:
        return []
    _, _, password = m.group("userinfo").partition(":")
    return [password] if password else [m.group("userinfo")]


def display_uri(uri: str) -> str:
    """A URI with its user-info hidden."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", uri or "")
