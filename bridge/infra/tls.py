"""TLS contexts built from certificate files, rebuilt when the files change.

The one mechanism behind every certificate the bridge is given: the fleet listener's own
certificate (and the CA its clients' certificates must chain to, for mutual TLS) and the
webhook sink's client certificate (and the CA bundle it trusts). Certificates are rotated
by agents that rewrite files (cert-manager, Vault agent, certbot, a cron job) without
telling anyone, so a `ReloadingContext` notices: every time a context is asked for (each
new connection: a TLS handshake on the listener, a connect in the sink) it compares a
`stat` of each file (modification time, size, inode; a few microseconds, far below the
handshake's own cost) with the one it loaded, and rebuilds the context when any differs.
The swap is one attribute assignment, so a connection gets the old or the new context,
never a mix. A new set that cannot be used (a key that does not match, a half-written file,
a missing CA) is logged and the previous context stays in use; it is tried again once the
files change again, not on every connection.

SIGHUP stays ignored (see `bridge.app.signals`): the configuration is read at start only, and the
file watch is what picks a renewed certificate up, so no signal, reload command or restart
is needed, and no agent must know which process to signal.

Values name a file (`/etc/x.pem` or `file:/etc/x.pem`, watched) or an environment variable
holding the PEM text (`env:VAR`, fixed for the life of the process, as the environment is).
OpenSSL loads certificate chains and keys from files only, so PEM text from the environment
is written to a private temporary file (0600 in a 0700 directory) for the moment of loading
and removed at once.

Every context requires TLS 1.2 or newer. Dates and names are read with `cryptography`
(imported only here, when certificates are configured), so an expired certificate is named
with its subject, issuer and end date instead of a bare TLS alert.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bridge.infra.secrets import placeholders_active

log = logging.getLogger("bridge.tls")

#: The oldest protocol version any context accepts (TLS 1.0 and 1.1 are deprecated, RFC 8996).
MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2
#: A certificate ending sooner than this is worth a warning.
EXPIRY_WARNING: Final = dt.timedelta(days=7)


class CertificateError(ValueError):
    """A certificate, key or CA that cannot be used; the message names the file and why."""


@dataclass(frozen=True, slots=True)
class Pem:
    """Where PEM text comes from: a file (watched for changes) or an environment variable."""

    path: Path | None = None
    env: str | None = None

    @classmethod
    def parse(cls, value: str) -> Pem:
        """`PATH`, `file:PATH` or `env:VAR`; `ValueError` for an empty or unset one."""
        if value.startswith("env:"):
            var = value[4:]
            if not var or (var not in os.environ and not placeholders_active()):
                raise ValueError(f"environment variable {var or '(none)'} is not set")
            return cls(env=var)
        path = value.removeprefix("file:")
        if not path:
            raise ValueError("must name a file: PATH, file:PATH or env:VAR")
        return cls(path=Path(path))

    def __str__(self) -> str:
        return str(self.path) if self.path is not None else f"env:{self.env}"

    def stamp(self) -> tuple[int, ...]:
        """What changes when the file is replaced or rewritten; () when it is missing (and
        for the environment, which does not change)."""
        if self.path is None:
            return ()
        try:
            st = self.path.stat()
        except OSError:
            return ()
        return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev)

    def read(self) -> bytes:
        if self.path is None:
            return os.environ.get(self.env or "", "").encode()
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise CertificateError(f"cannot read {self.path}: {exc.strerror or exc}") from None

    @contextlib.contextmanager
    def as_file(self) -> Iterator[str]:
        """A path OpenSSL can load: the file itself, or a private copy of the variable."""
        if self.path is not None:
            yield str(self.path)
            return
        import tempfile  # not at import: it pulls in shutil and random, for env: values only

        with tempfile.TemporaryDirectory(prefix="maintenance-bridge-tls-") as directory:
            target = Path(directory) / "pem"
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(self.read())
            yield str(target)


@dataclass(frozen=True, slots=True)
class CertificateInfo:
    """The first certificate of a chain file, as a person wants it named."""

    source: str
    subject: str
    issuer: str
    not_before: dt.datetime
    not_after: dt.datetime

    def named(self) -> str:
        return f"{self.source} ({self.subject}, issued by {self.issuer})"

    def describe(self) -> str:
        return f"{self.named()[:-1]}, valid until {self.not_after:%Y-%m-%dT%H:%M:%SZ})"

    def validity_problem(self, now: dt.datetime | None = None) -> str | None:
        """Why a peer would refuse the certificate by its dates alone, or None."""
        now = now or dt.datetime.now(dt.UTC)
        if now > self.not_after:
            return f"certificate {self.named()} EXPIRED at {self.not_after:%Y-%m-%dT%H:%M:%SZ}"
        if now < self.not_before:
            when = f"{self.not_before:%Y-%m-%dT%H:%M:%SZ}"
            return f"certificate {self.named()} is not valid before {when}"
        return None

    def expires_soon(self, now: dt.datetime | None = None) -> bool:
        return self.not_after - (now or dt.datetime.now(dt.UTC)) < EXPIRY_WARNING


def inspect_certificate(source: Pem) -> CertificateInfo:
    """Subject, issuer and dates of the first certificate in `source`."""
    from cryptography import x509

    data = source.read()
    try:
        cert = x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise CertificateError(f"{source} holds no PEM certificate: {exc}") from None
    return CertificateInfo(
        str(source),
        cert.subject.rfc4514_string() or "no subject",
        cert.issuer.rfc4514_string() or "no issuer",
        cert.not_valid_before_utc,
        cert.not_valid_after_utc,
    )


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A certificate chain and its key (both or neither), and the CA that verifies the peer.

    For a server, `ca` is the client CA: set, a client must present a certificate that chains
    to it (mutual TLS). For a client, `ca` is what the server's certificate must chain to
    (None: the public CAs of `default_cas`).
    """

    cert: Pem | None = None
    key: Pem | None = None
    ca: Pem | None = None

    def sources(self) -> tuple[Pem, ...]:
        return tuple(p for p in (self.cert, self.key, self.ca) if p is not None)

    def stamp(self) -> tuple[tuple[int, ...], ...]:
        return tuple(p.stamp() for p in self.sources())


def _load_chain(context: ssl.SSLContext, files: TlsFiles) -> CertificateInfo | None:
    if files.cert is None or files.key is None:
        return None
    info = inspect_certificate(files.cert)
    try:
        with files.cert.as_file() as cert, files.key.as_file() as key:
            context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise CertificateError(
                f"the key {files.key} does not belong to the certificate {files.cert}"
            ) from None
        reason = exc.reason or exc
        raise CertificateError(
            f"cannot load the certificate {files.cert} with the key {files.key}: {reason}"
        ) from None
    except OSError as exc:
        raise CertificateError(
            f"cannot read {files.cert} or {files.key}: {exc.strerror or exc}"
        ) from None
    return info


def _load_ca(context: ssl.SSLContext, ca: Pem) -> None:
    try:
        with ca.as_file() as path:
            context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        reason = exc.reason or exc
        raise CertificateError(f"cannot load CA certificates from {ca}: {reason}") from None
    except OSError as exc:
        raise CertificateError(f"cannot read {ca}: {exc.strerror or exc}") from None


def server_context(files: TlsFiles) -> tuple[ssl.SSLContext, CertificateInfo | None]:
    """A server context presenting `files.cert`; with `files.ca`, clients must present a
    certificate chaining to it (refused during the handshake otherwise)."""
    if files.cert is None or files.key is None:
        raise CertificateError("a TLS server needs a certificate and its key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    info = _load_chain(context, files)
    if files.ca is not None:
        _load_ca(context, files.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context, info


def default_cas() -> str:
    """The public CAs a client trusts when it is given none (certifi's bundle)."""
    import certifi

    return str(certifi.where())


def client_context(files: TlsFiles) -> tuple[ssl.SSLContext, CertificateInfo | None]:
    """A verifying client context: trusts `files.ca` (else the public CAs) and presents
    `files.cert` when one is given."""
    context = ssl.create_default_context(cafile=default_cas() if files.ca is None else None)
    context.minimum_version = MINIMUM_VERSION
    if files.ca is not None:
        _load_ca(context, files.ca)
    return context, _load_chain(context, files)


def warn_about_dates(info: CertificateInfo | None, what: str) -> None:
    """Log an expired, not yet valid or soon expiring certificate. Dates are warnings, not
    errors: the process keeps running and picks the renewed file up by itself."""
    if info is None:
        return
    problem = info.validity_problem()
    if problem is not None:
        log.warning("%s: %s; peers will refuse it until the file is renewed", what, problem)
    elif info.expires_soon():
        log.warning("%s: certificate %s expires soon", what, info.describe())


Build = Callable[[TlsFiles], tuple[ssl.SSLContext, "CertificateInfo | None"]]


def validate(files: TlsFiles, build: Build, what: str) -> None:
    """Load `files` once, as the configuration is checked: `CertificateError` for what
    cannot be used (a missing file, a key of another certificate, no PEM), a warning for
    dates (see `warn_about_dates`). Skipped for a command that uses no connection (the
    spool commands: `bridge.infra.secrets.placeholders_for_missing`), which then works
    without read access to the key."""
    if placeholders_active():
        return
    _, info = build(files)
    warn_about_dates(info, what)


class ReloadingContext:
    """The context of `files`, rebuilt when a file changes (see the module docstring).

    The first build happens here and raises `CertificateError`: what cannot be loaded at
    start is a configuration error (`validate` has said so already when the configuration
    was checked, dates included). Later failures are logged, kept in `error`, and the last
    good context stays in use.
    """

    def __init__(self, files: TlsFiles, build: Build, what: str) -> None:
        self.files = files
        self.what = what
        self._build = build
        self._stamp = files.stamp()
        self._context, self.certificate = build(files)
        #: Why the newest files could not be loaded (the previous ones are in use), or None.
        self.error: str | None = None

    def current(self) -> ssl.SSLContext:
        """The context for a new connection: rebuilt first if a file changed."""
        stamp = self.files.stamp()
        if stamp != self._stamp:
            self._stamp = stamp
            self._reload()
        return self._context

    def _reload(self) -> None:
        try:
            self._context, self.certificate = self._build(self.files)
        except (CertificateError, OSError) as exc:
            self.error = f"{exc}; still using the previous files"
            log.error("%s: the changed files cannot be used: %s", self.what, self.error)
            return
        self.error = None
        shown = self.certificate.describe() if self.certificate else "the changed files"
        log.info("%s: loaded %s", self.what, shown)
        warn_about_dates(self.certificate, self.what)

    def problem(self) -> str | None:
        """What is wrong with the certificate in use right now (a failed reload, dates), or
        None; what `doctor` and the health checks show."""
        self.current()
        dates = self.certificate.validity_problem() if self.certificate is not None else None
        found = [problem for problem in (self.error, dates) if problem is not None]
        return "; ".join(found) or None

    def server_context(self) -> ssl.SSLContext:
        """A context for a listener that presents the newest files on each handshake.

        A listening socket keeps the context it was created with, so this one only starts
        handshakes: its SNI callback (OpenSSL calls it for every ClientHello, with or without
        a server name) hands the connection the current context, whose certificate, key and
        CA store then apply. Its verify mode stays this context's, which is why whether a
        client CA is configured is fixed at start and only its file's content can change.
        """
        outer, _ = self._build(self.files)

        def choose(connection: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
            connection.context = self.current()

        outer.sni_callback = choose
        return outer
