"""HTTPS for the frontend: vLLM's ``--ssl-keyfile``, ``--ssl-certfile``, ``--ssl-ca-certs`` and
``--ssl-cert-reqs``, which are uvicorn's options of the same names.

``cert_reqs`` is the stdlib's ``ssl.CERT_NONE`` (0, the default: no client certificate asked
for), ``CERT_OPTIONAL`` (1: verified when sent) or ``CERT_REQUIRED`` (2: a client without a
certificate signed by a CA in ``ca_certs`` cannot connect).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from dyn.core.errors import ConfigError

CERT_REQS = (ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED)


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """The server's key and certificate (PEM files), and how clients are authenticated."""

    keyfile: str
    certfile: str
    ca_certs: str | None = None
    cert_reqs: int = ssl.CERT_NONE

    @classmethod
    def from_flags(
        cls, keyfile: str | None, certfile: str | None, ca_certs: str | None, cert_reqs: int
    ) -> TlsSettings | None:
        """The settings the flags ask for: None when neither file is given (plain HTTP);
        ``ConfigError`` when only one is, or the client options make no sense."""
        if cert_reqs not in CERT_REQS:
            raise ConfigError(
                f"--ssl-cert-reqs must be 0 (no client certificate), 1 (optional) or 2 (required), got {cert_reqs}"
            )
        if not keyfile and not certfile:
            if ca_certs or cert_reqs != ssl.CERT_NONE:
                raise ConfigError(
                    "--ssl-ca-certs and --ssl-cert-reqs need HTTPS: give --ssl-keyfile and --ssl-certfile too"
                )
            return None
        if not keyfile or not certfile:
            given, missing = (
                ("--ssl-keyfile", "--ssl-certfile") if keyfile else ("--ssl-certfile", "--ssl-keyfile")
            )
            raise ConfigError(f"{given} needs {missing} too (HTTPS needs the key and its certificate)")
        if cert_reqs != ssl.CERT_NONE and not ca_certs:
            raise ConfigError(
                "--ssl-cert-reqs 1 or 2 verifies client certificates: give --ssl-ca-certs, "
                "the CA file that signed them"
            )
        return cls(keyfile, certfile, ca_certs or None, cert_reqs)

    def uvicorn_options(self) -> dict[str, Any]:
        """These settings as ``uvicorn.Config`` keyword arguments."""
        return {
            "ssl_keyfile": self.keyfile,
            "ssl_certfile": self.certfile,
            "ssl_ca_certs": self.ca_certs,
            "ssl_cert_reqs": self.cert_reqs,
        }

    def check(self, config: Any) -> None:
        """Load ``config`` (a ``uvicorn.Config`` built with ``uvicorn_options``) now, so a missing
        or malformed file is a ``ConfigError`` naming the flags rather than a traceback later."""
        try:
            config.load()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot set up HTTPS from --ssl-keyfile {self.keyfile} --ssl-certfile {self.certfile}"
                + (f" --ssl-ca-certs {self.ca_certs}" if self.ca_certs else "")
                + f": {exc}"
            ) from None
