"""Secrets never leave soakd: the one redaction layer (vocabulary: any layer may import it).

What a workload says (an error text, an event, a log line, its description) and the config
as stored pass through here on their way out: to the run database (``store.db``'s frame and
event rows, ``store.runs``' run row), the logs (a structlog processor), the journal, sd_notify
and the CLI's error line. Masked, wherever they appear:

* the secret values registered with :func:`add_secret` (the API key, read from
  ``workload.api_key_env`` when the workload is built; a URL's password), also in their
  base64 and URL-encoded forms;
* the userinfo of every URL: ``http://user:pw@host`` -> ``http://user:***@host``, a bare
  ``http://token@host`` -> ``http://***@host``;
* the value of a known secret header or key (``Authorization``, ``Proxy-Authorization``,
  ``X-Api-Key``, ``api-key``, ``Cookie``, ``password``...), and any ``Bearer`` / ``Basic``
  credential;
* in stored mappings (:func:`data`), a string under a secret key; ``api_key_env`` (the
  variable's name may say whose key it is) is dropped.

A secret is masked before a text is cut to length by its owner (``RequestFailed``), so half
a key is never left behind.
"""

from __future__ import annotations

import base64
import re
import threading
from typing import Any
from urllib.parse import quote, quote_plus, unquote, urlsplit

MASK = "***"
#: keys whose string value is a secret (compared lower-case, ``-`` as ``_``)
SECRET_KEYS = frozenset(
    {
        "authorization", "proxy_authorization", "x_api_key", "api_key", "apikey", "cookie",
        "set_cookie", "password", "passwd", "secret", "token", "access_token", "auth_token",
        "x_auth_token", "client_secret",
    }
)  # fmt: skip
#: keys never stored at all (``describe()`` and the config as stored drop them)
UNSTORED_KEYS = frozenset({"api_key_env"})

_URL_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)([^/?#@\s:]*)(?::([^/?#@\s]*))?@", re.I)
#: an HTTP credential as the header spells it (``Bearer`` / ``Basic``, not "basic" in prose)
_SCHEME_CREDENTIAL = re.compile(r"\b(Bearer|Basic|bearer)(\s+)[A-Za-z0-9._~+/=:-]+")
_HEADER_NAMES = "|".join(sorted({k.replace("_", "[-_]?") for k in SECRET_KEYS}, key=len)[::-1])
_SECRET_FIELD = re.compile(
    rf"(?<![A-Za-z0-9_-])({_HEADER_NAMES})(['\"]?\s*[:=]\s*['\"]?)(?!\s*['\"]?{re.escape(MASK)})"
    r"[^'\"\r\n,&}]+",
    re.I,
)

_lock = threading.Lock()
_values: tuple[str, ...] = ()  # the registered secrets and their forms, longest first


#: a form shorter than this is not masked as a substring: masking every "ab" would leave
#: no text readable (a URL's userinfo and secret headers are masked whatever their length)
MIN_SECRET = 4


def _forms(value: str) -> set[str]:
    raw = value.encode()
    b64 = base64.b64encode(raw).decode()
    forms = {value, b64, b64.rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("=")}
    forms |= {quote(value, safe=""), quote_plus(value), quote(value)}
    return {f for f in forms if len(f) >= MIN_SECRET}


def add_secret(value: str | None) -> None:
    """Mask ``value`` (and its base64 and URL-encoded forms) in every text from now on."""
    global _values
    if not value:
        return
    with _lock:
        _values = tuple(sorted(set(_values) | _forms(value), key=len, reverse=True))


def add_url(url: str | None) -> None:
    """Register the password of ``url``'s userinfo, and the ``Basic`` form of ``user:pw``
    an HTTP client sends for it."""
    if not url:
        return
    try:
        p = urlsplit(url)
    except ValueError:
        return
    if p.password:
        add_secret(unquote(p.password))
        add_secret(f"{unquote(p.username or '')}:{unquote(p.password)}")


def url(u: str) -> str:
    """Every URL's userinfo in ``u`` masked: ``rtsp://cam:pw@h/x`` -> ``rtsp://cam:***@h/x``."""
    return _URL_USERINFO.sub(_mask_userinfo, u)


def _mask_userinfo(m: re.Match[str]) -> str:
    scheme, user, password = m.group(1), m.group(2), m.group(3)
    if password is None:  # a bare user part is often the token itself
        return f"{scheme}{MASK}@"
    return f"{scheme}{user}:{MASK}@"


def text(s: str) -> str:
    """``s`` with every registered secret, URL userinfo and secret header value masked."""
    if not s:
        return s
    s = _URL_USERINFO.sub(_mask_userinfo, s)  # first: keeps the user of ``user:pw@``
    for v in _values:
        if v in s:
            s = s.replace(v, MASK)
    s = _SCHEME_CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", s)
    return _SECRET_FIELD.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", s)


def _secret_key(key: object) -> bool:
    return isinstance(key, str) and key.lower().replace("-", "_") in SECRET_KEYS


def data(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, strings) fit to store: every string through
    :func:`text`, a string under a secret key masked, ``api_key_env`` dropped. Other values
    are kept as they are."""
    if isinstance(obj, str):
        return text(obj)
    if isinstance(obj, dict):
        return {
            k: (MASK if _secret_key(k) and isinstance(v, str) and v else data(v))
            for k, v in obj.items()
            if k not in UNSTORED_KEYS
        }
    if isinstance(obj, list | tuple):
        return type(obj)(data(v) for v in obj) if not hasattr(obj, "_fields") else obj
    return obj
