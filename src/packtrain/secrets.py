"""Keep credentials out of everything packtrain writes or prints: URIs, buffered ops, tags, warnings.

    redact_uri("https://user:secret@host:5000/x")      → "https://user:***@host:5000/x"
    redact_uri("https://ghp_token@host/x")             → "https://***@host/x"   (a lone userinfo may be a token)
    redact_uri("s3://b/k?X-Amz-Signature=ab12&v=1")    → "s3://b/k?X-Amz-Signature=***&v=1"
    redact_text("API request to https://u:pw@h/api failed")  → "API request to https://u:***@h/api failed"
    strip_userinfo("https://user:***@host/x")          → "https://host/x"

`redact_text` also replaces the values of the credential variables MLflow and the cloud SDKs read
(MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN, AWS_SECRET_ACCESS_KEY, ...: `SECRET_ENV`) wherever they
appear in the text, so an exception message that echoes a header or a URL cannot leak them.
Stores are recorded under their redacted URI; `packtrain mlflow replay` takes the credentials from
--tracking-uri or from MLflow's own MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or _TOKEN).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
# credential variables whose values must never appear in output (MLflow's own, the object stores' it uses)
SECRET_ENV = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_CLIENT_SECRET",
              "DATABRICKS_TOKEN", "DATABRICKS_CLIENT_SECRET", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
              "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_SECRET",
              "GOOGLE_APPLICATION_CREDENTIALS_JSON", "HF_TOKEN")
# query parameters that carry a credential (pre-signed URLs, SAS tokens, API keys)
_SECRET_QUERY = re.compile(r"(?i)^(x-amz-signature|x-amz-credential|x-amz-security-token|signature|sig|token|"
                           r"access_token|api_key|apikey|key|password|secret|client_secret)$")
# scheme://userinfo@ inside free text; userinfo stops at whitespace, '/', '@' and quotes
_URI_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s/@:'\"<>]*)"
                           r"(?::(?P<password>[^\s/'\"<>]*))?@")  # a raw '@' in a password: up to the last one
_QUERY_SECRET_IN_TEXT = re.compile(r"(?i)([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|"
                                   r"signature|sig|token|access_token|api_key|apikey|password|secret|"
                                   r"client_secret)=)[^&\s'\"<>]+")
_MIN_SECRET_LEN = 4  # shorter env values would mask ordinary words


def redact_uri(uri: str | None) -> str | None:
    """`uri` with the password of its userinfo (or a lone userinfo, which may be a token) and credential
    query values replaced by ***. Anything that is not a URI with a scheme is returned unchanged."""
    if not uri or "://" not in uri:
        return uri
    try:
        parts = urlsplit(uri)
    except ValueError:
        return redact_text(uri)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, sep, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if sep and user else f"{MASK}@{host}"
    query = parts.query
    if query:
        fields = []
        for item in query.split("&"):
            k, eq, _ = item.partition("=")
            fields.append(f"{k}={MASK}" if eq and _SECRET_QUERY.match(k) else item)
        query = "&".join(fields)
    if (netloc, query) == (parts.netloc, parts.query):
        return uri   # nothing secret; urlunsplit would also turn sqlite://// into sqlite://
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_userinfo(uri: str | None) -> bool:
    """True when `uri` carries credentials in its authority (`scheme://user:pw@host`)."""
    if not uri or "://" not in uri:
        return False
    try:
        return "@" in urlsplit(uri).netloc
    except ValueError:
        return False


def strip_userinfo(uri: str) -> str:
    """`uri` without its userinfo: `https://user:***@host/x` → `https://host/x` (credentials then come from
    MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN)."""
    parts = urlsplit(uri)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    """The non-trivial values of the `SECRET_ENV` variables set now (longest first)."""
    env = os.environ if env is None else env
    vals = {env[k] for k in SECRET_ENV if len(env.get(k) or "") >= _MIN_SECRET_LEN}
    return sorted(vals, key=len, reverse=True)


def redact_text(text: str) -> str:
    """Every `scheme://user:password@` in `text` → `scheme://user:***@`, credential query values → ***, and
    the values of the `SECRET_ENV` variables → ***."""
    if not text:
        return text

    def _userinfo(m: re.Match) -> str:
        if m.group("password") is not None and m.group("user"):
            return f"{m.group('scheme')}{m.group('user')}:{MASK}@"
        return f"{m.group('scheme')}{MASK}@"

    out = _URI_USERINFO.sub(_userinfo, text)
    out = _QUERY_SECRET_IN_TEXT.sub(lambda m: m.group(1) + MASK, out)
    for v in secret_values():
        out = out.replace(v, MASK)
    return out


def redact_value(value: object) -> str:
    """`str(value)` with `redact_text` applied (params and tags logged to MLflow go through this)."""
    return redact_text(str(value))
