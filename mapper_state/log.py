"""Messages on stderr: one line each, secrets redacted, as text or as JSON objects.

Everything mapper-state says goes through here so that no secret can slip out
(every configured secret is replaced by ``***``) and ``--log-format json`` gives
one JSON object per line for log collectors. ``MAPPER_STATE_DEBUG=1`` adds the
debug logs of the retry layer and of the cloud SDKs (HTTP requests included),
through the same redaction.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, Protocol

import orjson

from mapper_state import redact

_json = False
#: Warnings and errors as the Singer SDK's structured lines, which Meltano re-emits at their
#: level (see :func:`mapper_state.meltano.env.parses_structured_lines`).
_singer_sdk = False


DEBUG_VAR = "MAPPER_STATE_DEBUG"


class LogSettings(Protocol):
    """What logging needs of the settings (:class:`mapper_state.settings.Settings` has it)."""

    @property
    def log_format(self) -> str: ...

    def secrets(self) -> list[str]: ...


def configure(settings: LogSettings) -> None:
    """Remember the secrets to hide and the format to use; with ``MAPPER_STATE_DEBUG``, debug logs."""
    global _json
    redact.remember(settings.secrets())
    _json = settings.log_format == "json"
    if os.environ.get(DEBUG_VAR):
        _debug_logging()


class _Redacting(logging.Handler):
    """Python logging (the retry layer's and the cloud SDKs') through :func:`emit`."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except (TypeError, ValueError, KeyError):  # a library's malformed log call (bad %-args)
            text = str(record.msg)
        emit("debug", f"{record.name}: {text}")


def _debug_logging() -> None:
    """Every library's debug log on stderr, one line each, with every secret hidden."""
    root = logging.getLogger()
    if not any(isinstance(h, _Redacting) for h in root.handlers):
        root.addHandler(_Redacting())
    root.setLevel(logging.DEBUG)


def _redact(text: str) -> str:
    return redact.redact_known(text)


def emit(level: str, message: str, detail: str = "", **fields: Any) -> None:
    """One line; a ``detail`` of our own (YAML to paste) follows it as it is, indented."""
    message = _redact(" ".join(message.splitlines()) or message)
    if _json:
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "level": level,
            "message": message,
        }
        if detail:
            record["detail"] = _redact(detail)
        record.update({k: (_redact(v) if isinstance(v, str) else v) for k, v in fields.items()})
        line = orjson.dumps(record).decode()
    else:
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        prefix = "" if level == "info" else f"{level}: "
        line = f"mapper-state: {prefix}{message}" + (f" ({_redact(extra)})" if extra else "")
        rows = "".join(f"\n    {row}" for row in _redact(detail).splitlines())
        line = (
            _singer_sdk_line(level, line, rows) if _singer_sdk and level != "info" else line + rows
        )
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass


def singer_sdk_lines(on: bool) -> None:
    """Write warnings and errors as the Singer SDK's structured lines (``on``) or as text."""
    global _singer_sdk
    _singer_sdk = on


def _singer_sdk_line(level: str, line: str, rows: str) -> str:
    """The text line in the fields Meltano's ``singer-sdk`` log parser requires; the detail
    rows, if any, follow as they are (Meltano passes them on at its stderr level)."""
    record = {
        "level": level,
        "pid": os.getpid(),
        "logger_name": "mapper-state",
        "ts": time.time(),
        "thread_name": threading.current_thread().name,
        "app_name": "mapper-state",
        # Meltano 4.3.0's parser requires the field (4.4 reads it when there): no stream
        "stream_name": None,
        "message": line,
    }
    return orjson.dumps(record).decode() + rows


def traceback_text(text: str) -> None:
    """A multi-line text (a traceback asked for with ``MAPPER_STATE_DEBUG``), secrets hidden."""
    try:
        sys.stderr.write(_redact(text))
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass


def info(message: str, **fields: Any) -> None:
    emit("info", message, **fields)


def warning(message: str, **fields: Any) -> None:
    emit("warning", message, **fields)


def error(message: str, detail: str = "", **fields: Any) -> None:
    emit("error", message, detail, **fields)
