"""HTTPS on a real ``dyn frontend`` and ``dyn serve`` (issue 18 item 5), through the official
``openai`` client, with certificates made here.

The flags are vLLM's (``vllm/entrypoints/openai/cli_args.py``: ``--ssl-keyfile``,
``--ssl-certfile``, ``--ssl-ca-certs``, ``--ssl-cert-reqs``), which vLLM hands to uvicorn as its
options of the same names (``api_server.py build_and_serve``); ``--ssl-cert-reqs 2`` is
``ssl.CERT_REQUIRED``. vLLM prints its listen address with ``https://`` when both files are given
(``setup_server``); so do ``dyn frontend`` and ``dyn serve``.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dyn.core.serve import parse_ready_url
from tests.waiting import poll_until

x509 = pytest.importorskip(
    "cryptography.x509", reason="making test certificates needs the cryptography package"
)
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")


@dataclass
class Pki:
    """A CA and the server and client certificates it signed (PEM files)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self, *, with_cert: bool = True, trust: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca) if trust else None)
        if with_cert:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(path: Path, cert, key) -> tuple[Path, Path]:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path.with_suffix(".crt"), path.with_suffix(".key")


def _issue(common: str, ca_cert, ca_key, *, is_ca: bool = False, san: list | None = None):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca_cert.subject if ca_cert is not None else _name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    return builder.sign(ca_key if ca_key is not None else key, hashes.SHA256()), key


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca_cert, ca_key = _issue("dyn test CA", None, None, is_ca=True)
    ca, _ = _write(root / "ca", ca_cert, ca_key)
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server_cert, server_key = _write(root / "server", *_issue("localhost", ca_cert, ca_key, san=san))
    client_cert, client_key = _write(root / "client", *_issue("dyn test client", ca_cert, ca_key))
    return Pki(ca, server_cert, server_key, client_cert, client_key)


def _tls_flags(pki: Pki, *extra: str) -> tuple[str, ...]:
    return ("--ssl-keyfile", str(pki.server_key), "--ssl-certfile", str(pki.server_cert), *extra)


def _wait_routable(url: str, context: ssl.SSLContext, count: int) -> None:
    def routable():
        try:
            return len(httpx.get(f"{url}/health", verify=context, timeout=5).json()["instances"]) == count
        except httpx.HTTPError:
            return False

    poll_until(routable, 60, f"{count} routable workers at {url}")


def _client(url: str, context: ssl.SSLContext):
    return openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", http_client=httpx.Client(verify=context), max_retries=0
    )


def test_https_with_the_openai_client(stack_factory, pki):
    stack = stack_factory("tls")
    stack.worker("--block-size", "16")
    url = stack.start_frontend(*_tls_flags(pki))
    assert url.startswith("https://127.0.0.1:"), url
    trusted = pki.client_context(with_cert=False)
    _wait_routable(url, trusted, 1)
    with _client(url, trusted) as client:
        reply = client.chat.completions.create(
            model="dyn-tiny",
            messages=[{"role": "user", "content": "Hello!"}],
            max_tokens=4,
            extra_body={"ignore_eos": True},  # the mocker's random tokens include EOS now and then
        )
        assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens == 4
        stream = client.completions.create(model="dyn-tiny", prompt="Hello", max_tokens=3, stream=True)
        assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].text) >= 1
    # a client that does not trust the CA refuses the server; plain HTTP gets no answer
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{url}/health", verify=ssl.create_default_context(), timeout=5)
    with pytest.raises(httpx.TransportError):
        httpx.get(url.replace("https://", "http://") + "/health", timeout=5)


def test_a_client_certificate_is_required_with_cert_reqs_2(stack_factory, pki):
    stack = stack_factory("mtls")
    stack.worker("--block-size", "16")
    url = stack.start_frontend(*_tls_flags(pki, "--ssl-ca-certs", str(pki.ca), "--ssl-cert-reqs", "2"))
    with_cert = pki.client_context()
    _wait_routable(url, with_cert, 1)
    with _client(url, with_cert) as client:
        reply = client.chat.completions.create(
            model="dyn-tiny",
            messages=[{"role": "user", "content": "Hello!"}],
            max_tokens=2,
            extra_body={"ignore_eos": True},
        )
        assert reply.usage.completion_tokens == 2
    with (
        _client(url, pki.client_context(with_cert=False)) as client,
        pytest.raises(openai.APIConnectionError),
    ):
        client.models.list()


def test_dyn_serve_serves_https_and_says_so(dyn_process, pki):
    proc = dyn_process(
        "serve",
        "--http-port",
        "0",
        "--workers",
        "1",
        "--namespace",
        "tlsserve",
        *_tls_flags(pki, "--ssl-ca-certs", str(pki.ca), "--ssl-cert-reqs", "2"),
    )

    def ready():
        for line in proc.log().splitlines():
            found = parse_ready_url(line)
            if found:
                return found
        if proc.proc.poll() is not None:
            raise AssertionError(f"dyn serve exited:\n{proc.log()}")
        return None

    base = poll_until(ready, 90, "dyn serve's ready line")
    assert base.startswith("https://127.0.0.1:") and base.endswith("/v1"), base
    with _client(base.removesuffix("/v1"), pki.client_context()) as client:
        assert [m.id for m in client.models.list()] == ["dyn-tiny"]
    assert proc.terminate(timeout=30) == 0, proc.log()


def test_bad_tls_files_are_refused_at_start(dyn_process, pki, tmp_path):
    missing = tmp_path / "missing.pem"
    proc = dyn_process(
        "frontend", "--http-port", "0", "--ssl-keyfile", str(missing), "--ssl-certfile", str(missing)
    )
    assert proc.proc.wait(60) == 2, proc.log()
    assert "cannot set up HTTPS" in proc.log() and "Traceback" not in proc.log()
    proc = dyn_process("frontend", "--http-port", "0", "--ssl-keyfile", str(pki.server_key))
    assert proc.proc.wait(60) == 2, proc.log()
    assert "--ssl-keyfile needs --ssl-certfile" in proc.log()
