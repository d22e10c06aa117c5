"""Principal names: ``User:<name>``, whether the name came from SCRAM or from a client certificate's CN."""

from __future__ import annotations

import re
from typing import Final

USER_PREFIX: Final = "User:"
_USER_RE: Final = re.compile(r"[A-Za-z0-9._@-]{1,128}")
USER_NAME_RULE: Final = "1-128 letters, digits, '.', '_', '@' or '-'"


def check_user_name(name: str) -> str:
    """``name`` if it is a valid user name, else ValueError saying the rule (no SASLprep: ASCII only)."""
    if not isinstance(name, str) or not _USER_RE.fullmatch(name):
        raise ValueError(f"user name {name!r} is not valid: {USER_NAME_RULE}")
    return name


def user_principal(name: str) -> str:
    return f"{USER_PREFIX}{name}"


def peer_common_name(peercert: object) -> str | None:
    """The subject CN of a verified peer certificate (``SSLSocket.getpeercert()``'s dict), or None."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
