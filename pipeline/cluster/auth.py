"""The cluster's auth token: found the way Ray's own loader finds it, sent only in a request header.

Ray clusters started with token authentication (the default in Ray 2.60 when a token exists, or with
``RAY_AUTH_MODE=token``) refuse requests without ``Authorization: Bearer <token>``. The lookup order is
Ray's: ``--auth-token-file``, else ``RAY_AUTH_TOKEN``, else the file named by ``RAY_AUTH_TOKEN_PATH``, else
``~/.ray/auth_token`` (none of these but the option when ``RAY_AUTH_MODE=disabled``). The value is never
printed, logged or written anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


class TokenFileError(Exception):
    """A token file that cannot be read or is empty; the message names the file, never its content."""


@dataclass
class Token:
    """A bearer token and where it came from. ``repr`` and ``str`` never show the value."""

    value: str = field(repr=False)
    source: str

    def __str__(self) -> str:
        return f"<token from {self.source}>"

    def header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.value}"}


def resolve_token(token_file: str | None, environ: dict | None = None, home: Path | None = None) -> Token | None:
    """Find the cluster's token in Ray's order; None when there is none (the cluster may not need one)."""
    environ = os.environ if environ is None else environ
    if token_file:
        return _read_token_file(Path(token_file).expanduser(), "--auth-token-file")
    if environ.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return None  # as Ray's own clients: an explicit opt-out sends no token (--auth-token-file still does)
    if environ.get("RAY_AUTH_TOKEN", "").strip():
        return Token(environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN")
    if environ.get("RAY_AUTH_TOKEN_PATH"):
        return _read_token_file(Path(environ["RAY_AUTH_TOKEN_PATH"]).expanduser(), "RAY_AUTH_TOKEN_PATH")
    default = (home if home is not None else Path.home()) / ".ray" / "auth_token"
    if default.is_file():
        return _read_token_file(default, "~/.ray/auth_token")
    return None


def _read_token_file(path: Path, what: str) -> Token:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise TokenFileError(f"cannot read the auth token file ({what}: {path}): {exc.strerror or exc}") from None
    if not value:
        raise TokenFileError(f"the auth token file is empty ({what}: {path})")
    return Token(value, f"{what} ({path})")
