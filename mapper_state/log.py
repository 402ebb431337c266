"""Messages on stderr: one line each, secrets redacted, as text or as JSON objects.

Everything mapper-state says goes through here so that no secret can slip out
(every configured secret is replaced by ``***``) and ``--log-format json`` gives
one JSON object per line for log collectors.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import orjson

from mapper_state import redact

_json = False


def configure(settings: Any) -> None:
    """Remember the secrets to hide and the format to use."""
    global _json
    redact.remember(settings.secrets())
    _json = settings["log_format"] == "json"


def _redact(text: str) -> str:
    return redact.redact_known(text)


def emit(level: str, message: str, **fields: Any) -> None:
    message = _redact(" ".join(message.splitlines()) or message)
    if _json:
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "level": level,
            "message": message,
        }
        record.update({k: (_redact(v) if isinstance(v, str) else v) for k, v in fields.items()})
        line = orjson.dumps(record).decode()
    else:
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        prefix = "" if level == "info" else f"{level}: "
        line = f"mapper-state: {prefix}{message}" + (f" ({_redact(extra)})" if extra else "")
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass


def info(message: str, **fields: Any) -> None:
    emit("info", message, **fields)


def warning(message: str, **fields: Any) -> None:
    emit("warning", message, **fields)


def error(message: str, **fields: Any) -> None:
    emit("error", message, **fields)
