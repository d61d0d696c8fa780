"""deploy/ for the fleet service: the unit, the Kubernetes manifests, the compose file and the
example fleet.toml files, checked offline with the tools operators use.

Nothing here deploys: there is no cluster, no container engine and no systemd as PID 1 on
CI. The manifests are validated against the Kubernetes schemas (kubernetes-validate) and by
checkov, the unit by `systemd-analyze verify` and `security --offline=yes`, the compose file
by Debian's `docker-compose config` (it reads and validates the file without an engine).
Every command line goes through the bridge's own parser, every configuration through its
own loader.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from aiohttp.test_utils import make_mocked_request

from bridge import __version__
from bridge.cli import EXIT_CONFIG, build_parser
from bridge.config import load_config
from bridge.fleet.auth import AccessGuard
from bridge.fleet.config import FleetConfig, HttpSourceConfig, load_fleet_config
from tests.debian_tool import debian_tool
from tests.test_deploy import KUBERNETES_VERSIONS, TEST_SECRET, dockerfile_user, quantity

pytestmark = pytest.mark.posix  # systemd, the Linux container and their linters

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
MANIFESTS = DEPLOY / "kubernetes" / "fleet"
EXAMPLES = DEPLOY / "fleet"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
UNIT = DEPLOY / "systemd" / "maintenance-fleet.service"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: What operators accept: systemd rates 2.0 and below "OK" (docs/operations.md says so too).
MAX_EXPOSURE = 2.0


def run(*argv: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=300, **kwargs
    )


def parse_command(argv: list[str]) -> Any:
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"not a valid maintenance-bridge command line: {argv} (exit {exc.code})")


def with_secret_files(text: str, mounts: dict[str, str], tmp_path: Path) -> str:
    """`text` with each `file:MOUNT/NAME` secret pointed at a stand-in file under tmp_path:
    a webhook secret for the sources, a token of its own for each `*-token` (the service
    refuses two credentials sharing one)."""

    def stand_in(match: re.Match[str]) -> str:
        where = tmp_path / Path(match[1]).name
        where.mkdir(exist_ok=True)
        value = secrets.token_hex(32) if match[2].endswith("-token") else TEST_SECRET
        (where / match[2]).write_text(value + "\n")
        return f"file:{where / match[2]}"

    alternatives = "|".join(re.escape(mount) for mount in mounts.values())
    return re.sub(rf"file:({alternatives})/([\w.-]+)", stand_in, text)


def load_example(text: str, tmp_path: Path, mounts: dict[str, str]) -> FleetConfig:
    path = tmp_path / "fleet.toml"
    path.write_text(with_secret_files(text, mounts, tmp_path))
    return load_fleet_config(path, {})


# -- Kubernetes ------------------------------------------------------------------------------


def manifests() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    return [
        document
        for name in kustomization["resources"]
        for document in yaml.safe_load_all((MANIFESTS / name).read_text())
        if document
    ]


def manifest(kind: str) -> dict[str, Any]:
    (found,) = [m for m in manifests() if m["kind"] == kind]
    return found


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = manifest("Deployment")["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    (only,) = pod_spec()["containers"]
    return dict(only)


def pod_labels() -> dict[str, str]:
    labels: dict[str, str] = manifest("Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def selects_the_pods(selector: dict[str, str]) -> bool:
    return selector.items() <= pod_labels().items()


def pod_config(tmp_path: Path) -> FleetConfig:
    """The configuration a pod runs with: the ConfigMap's file and the mounted secret."""
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    return load_example(manifest("ConfigMap")["data"]["fleet.toml"], tmp_path, mounts)


def test_the_kustomization_applies_every_manifest_of_the_fleet() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    on_disk = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(on_disk)
    kinds = {m["kind"] for m in manifests()}
    assert {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "Secret"} <= kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_fleet_manifest_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    problems = []
    for document in manifests():
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            problems.append(f"{document['kind']} {where}: {exc.message}")
    assert not problems, f"invalid for Kubernetes {version}:\n" + "\n".join(problems)


def test_everything_lives_in_a_restricted_namespace() -> None:
    namespace = manifest("Namespace")
    name = namespace["metadata"]["name"]
    assert {m["metadata"].get("namespace", name) for m in manifests()} == {name}
    # The fleet needs no host access: the strictest Pod Security Standard admits it.
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_configmap_is_the_postgres_example_as_it_is() -> None:
    text = manifest("ConfigMap")["data"]["fleet.toml"]
    assert text == (EXAMPLES / "fleet-postgres.toml").read_text()


def test_the_pod_runs_the_fleet_service_with_the_mounted_config(tmp_path: Path) -> None:
    args = parse_command(container()["args"])
    assert (args.command, args.fleet_command) == ("fleet", "serve")
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    assert args.config == Path(mounts["config"]) / "fleet.toml"
    config = pod_config(tmp_path)
    assert config.store.url.startswith("postgresql://")  # replicas share one store
    (source,) = config.sources
    assert isinstance(source, HttpSourceConfig)
    assert source.authenticated
    assert not config.listener.loopback
    assert_reads_need_their_own_credentials(config)


def assert_reads_need_their_own_credentials(config: FleetConfig) -> None:
    """Off loopback the deployments protect reads with two credentials, never public_read:
    one `read` (dashboards, people) and one `eligible` (the VMs' election recipes)."""
    assert config.auth.protects_reads
    assert not config.auth.public_read
    scopes = sorted(credential.scopes for credential in config.auth.credentials)
    assert scopes == [("eligible",), ("read",)]


def scopes_needed(config: FleetConfig) -> dict[str, str | None]:
    """What the service's own access guard asks of a request to each path (None: open),
    with this configuration's listener."""
    guard = AccessGuard(config.auth, loopback=config.listener.loopback)
    paths = ["/healthz", "/readyz", "/metrics", "/", "/v1/fleet/summary", "/v1/fleet/eligible"]
    return {path: guard.needs(make_mocked_request("GET", path)) for path in paths}


def test_every_secret_the_pod_reads_is_a_key_of_the_secret() -> None:
    secret = manifest("Secret")
    keys = set(secret["stringData"])
    used = {
        item["valueFrom"]["secretKeyRef"]["key"]
        for item in container().get("env", [])
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    for volume in pod_spec()["volumes"]:
        if "secret" in volume:
            assert volume["secret"]["secretName"] == secret["metadata"]["name"]
            used |= {item["key"] for item in volume["secret"]["items"]}
    assert used == keys
    # The signing secret is a file; only libpq's password comes from the environment.
    assert [item["name"] for item in container()["env"]] == ["PGPASSWORD"]


@pytest.mark.parametrize(
    ("key", "named"),
    [
        ("webhook-secret", "fleet.sources[0].secrets"),
        ("read-token", "fleet.auth.credentials[0].token"),
        ("eligible-token", "fleet.auth.credentials[1].token"),
    ],
)
def test_each_placeholder_secret_is_refused_with_a_reason(
    key: str, named: str, tmp_path: Path
) -> None:
    placeholder = manifest("Secret")["stringData"][key]
    text = manifest("ConfigMap")["data"]["fleet.toml"]
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    path = tmp_path / "fleet.toml"
    path.write_text(with_secret_files(text, mounts, tmp_path))
    (tmp_path / "maintenance-fleet" / key).write_text(placeholder)
    result = run(sys.executable, "-m", "bridge", "fleet", "--config", path, "status", cwd=ROOT)
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert named in result.stderr


def test_probes_and_scrapes_reach_the_listener(tmp_path: Path) -> None:
    config = pod_config(tmp_path)
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert ports == {"http": config.listener.port}
    probes = {
        kind: container()[kind]["httpGet"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes == {
        "startupProbe": {"path": "/healthz", "port": "http"},
        "livenessProbe": {"path": "/healthz", "port": "http"},
        "readinessProbe": {"path": "/readyz", "port": "http"},
    }
    annotations = manifest("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(config.listener.port)
    # Annotation discovery carries no token: /metrics is open (the NetworkPolicy limits who
    # reaches it), while the rest of the API needs its credentials. /healthz and /readyz are
    # always open.
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert scopes_needed(config) == {
        "/healthz": None,
        "/readyz": None,
        "/metrics": None,
        "/": "read",
        "/v1/fleet/summary": "read",
        "/v1/fleet/eligible": "eligible",
    }
    service = manifest("Service")["spec"]
    assert selects_the_pods(service["selector"])
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [
        (config.listener.port, "http")
    ]


def test_requests_are_sized_from_the_benchmark() -> None:
    text = (ROOT / "bench" / "results" / "fleet.md").read_text()
    match = re.search(r"fleet service peak RSS: (\d+) MiB", text)
    assert match, "bench/results/fleet.md no longer gives the peak RSS"
    peak = int(match[1]) * 2**20
    resources = container()["resources"]
    assert quantity(resources["requests"]["memory"]) >= peak
    assert quantity(resources["limits"]["memory"]) >= 2 * peak  # a backlog after an outage
    for resource in ("cpu", "memory"):
        assert (
            0 < quantity(resources["requests"][resource]) <= quantity(resources["limits"][resource])
        )


def test_the_fleet_runs_unprivileged_on_a_read_only_root() -> None:
    pod = pod_spec()["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert (pod["runAsUser"], pod["runAsGroup"]) == dockerfile_user()
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container()["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert manifest("ServiceAccount")["automountServiceAccountToken"] is False
    assert pod_spec()["automountServiceAccountToken"] is False


def test_a_drain_or_a_rollout_never_stops_ingest() -> None:
    deployment = manifest("Deployment")["spec"]
    assert deployment["replicas"] >= 2
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budget = manifest("PodDisruptionBudget")["spec"]
    assert selects_the_pods(budget["selector"]["matchLabels"])
    assert 1 <= budget["minAvailable"] < deployment["replicas"]


def test_the_network_policy_admits_sidecars_and_readers_and_reaches_the_store(
    tmp_path: Path,
) -> None:
    policy = manifest("NetworkPolicy")["spec"]
    assert selects_the_pods(policy["podSelector"]["matchLabels"])
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    peers = ingress["from"]
    assert any("ipBlock" in p for p in peers)  # host-network sidecars come from node addresses
    (readers,) = [p["namespaceSelector"] for p in peers if "namespaceSelector" in p]
    assert readers["matchExpressions"][0]["key"] == "kubernetes.io/metadata.name"
    egress_ports = {port["port"] for rule in policy["egress"] for port in rule["ports"]}
    assert egress_ports == {53, 5432}
    assert pod_config(tmp_path).store.url.partition("@")[2].startswith("postgres:5432/")


def test_the_manifests_deploy_this_version_of_the_image_with_postgres() -> None:
    image = f"maintenance-bridge:{__version__}-postgres"
    assert container()["image"] == image
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert kustomization["images"] == [
        {"name": "maintenance-bridge", "newTag": f"{__version__}-postgres"}
    ]
    assert "postgres" in PYPROJECT["project"]["optional-dependencies"]


# -- Example configurations ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "scheme"), [("fleet-sqlite.toml", "sqlite"), ("fleet-postgres.toml", "postgresql")]
)
def test_each_example_loads_and_shows_every_key(name: str, scheme: str, tmp_path: Path) -> None:
    text = (EXAMPLES / name).read_text()
    mounts = {
        "credentials": "/run/credentials/maintenance-fleet.service",
        "secrets": "/run/secrets/maintenance-fleet",
    }
    config = load_example(text, tmp_path, mounts)
    assert config.store.url.startswith(f"{scheme}://")
    assert_reads_need_their_own_credentials(config)
    # Every key of every table is written out (and commented), not left to the defaults;
    # the optional ones (TLS files, the signing-in proxy) commented out, as TOML has no way
    # to write "none".
    written = tomllib.loads(text)["fleet"]
    optional = {"tls_cert", "tls_key", "client_ca", "proxy_header", "trusted_proxies"}
    for table in ("listener", "store", "retention", "api", "auth"):
        keys = set(getattr(config, table).__struct_fields__)
        assert set(written[table]) == keys - optional, table
        for key in keys & optional:
            assert f"\n# {key} = " in text, key
    (source,) = written["sources"]
    assert set(source) == set(HttpSourceConfig.__struct_fields__) - {"secret", "token"}
    assert text.count("\n#") >= 10


# -- systemd ---------------------------------------------------------------------------------


def unit() -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            key, _, value = line.partition("=")
            current.append((key.strip(), value.strip()))
    return sections


def services(key: str) -> list[str]:
    """Every value of a key the unit may set several times (LoadCredential=)."""
    values = [v for k, v in unit()["Service"] if k == key]
    assert values, f"{key}= is not set"
    return values


def service(key: str) -> str:
    return services(key)[-1]


def test_the_fleet_unit_is_hardened() -> None:
    expected = {
        "Type": "exec",  # neither program speaks sd_notify
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "StateDirectory": "maintenance-fleet",
        "StateDirectoryMode": "0700",
        "Restart": "on-failure",
        "RestartPreventExitStatus": str(EXIT_CONFIG),
        "UMask": "0077",
    }
    assert {key: service(key) for key in expected} == expected


def test_the_unit_runs_the_fleet_with_the_sqlite_example(tmp_path: Path) -> None:
    argv = shlex.split(service("ExecStart"))
    assert Path(argv[0]).name in PYPROJECT["project"]["scripts"]
    args = parse_command(argv[1:])
    assert (args.command, args.fleet_command) == ("fleet", "serve")
    assert args.config.parent == Path("/etc") / service("ConfigurationDirectory")
    # The example's store is in the state directory; its secret and its two tokens are the
    # unit's credentials, and every file: the example names is one of them.
    credentials = f"/run/credentials/{UNIT.name}"
    text = (EXAMPLES / "fleet-sqlite.toml").read_text()
    loaded = {}
    for entry in services("LoadCredential"):
        credential, _, source = entry.partition(":")
        assert Path(source).parent == args.config.parent
        loaded[credential] = f"file:{credentials}/{credential}"
    assert set(loaded) == {"webhook-secret", "read-token", "eligible-token"}
    assert set(re.findall(r'"(file:[^"]+)"', text)) == set(loaded.values())
    config = load_example(text, tmp_path, {"credentials": credentials})
    path = Path(config.store.url.removeprefix("sqlite://"))
    assert path.parent == Path("/var/lib") / service("StateDirectory")
    # No network policy in front of a VM: Prometheus presents the read token for /metrics.
    assert scopes_needed(config) == {
        "/healthz": None,
        "/readyz": None,
        "/metrics": "read",
        "/": "read",
        "/v1/fleet/summary": "read",
        "/v1/fleet/eligible": "eligible",
    }


def unit_for_this_machine(tmp_path: Path) -> Path:
    """The unit with ExecStart at this environment's real script (verify checks it exists)."""
    script = Path(sys.executable).parent / "maintenance-bridge"
    path = tmp_path / UNIT.name
    path.write_text(
        UNIT.read_text().replace("/opt/maintenance-bridge/bin/maintenance-bridge", str(script))
    )
    return path


def exposure(unit_path: Path) -> float:
    """systemd's exposure rating of a unit file: 0 (locked down) to 10 (unprotected)."""
    tool = debian_tool("systemd-analyze", "systemd")
    result = run(tool, "security", "--offline=yes", "--no-pager", unit_path)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    return float(match[1])


def test_systemd_analyze_verify_accepts_the_fleet_unit(tmp_path: Path) -> None:
    path = unit_for_this_machine(tmp_path)
    result = run(debian_tool("systemd-analyze", "systemd"), "verify", "--man=no", path)
    assert result.returncode == 0, result.stderr
    assert not [line for line in result.stderr.splitlines() if path.name in line], result.stderr


def test_both_units_rate_ok_in_systemd_analyze_security(tmp_path: Path) -> None:
    sidecar = DEPLOY / "systemd" / "maintenance-bridge.service"
    ratings = {UNIT.name: exposure(unit_for_this_machine(tmp_path))}
    copy = tmp_path / sidecar.name
    copy.write_text(sidecar.read_text())
    ratings[sidecar.name] = exposure(copy)
    assert all(rating <= MAX_EXPOSURE for rating in ratings.values()), ratings
    # The figures the docs give are the ones measured.
    operations = (ROOT / "docs" / "operations.md").read_text()
    for name, rating in ratings.items():
        assert f"{name}` rates {rating:.1f}" in operations, (name, rating)


# -- compose -----------------------------------------------------------------------------------


def compose_config() -> dict[str, Any]:
    """The compose file as Debian's docker-compose resolves and validates it (no engine runs
    here: `config` reads, merges and checks the file against its schema, nothing more)."""
    tool = debian_tool("docker-compose", "docker-compose")
    result = run(tool, "--file", COMPOSE, "config", cwd=ROOT, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    resolved: dict[str, Any] = yaml.safe_load(result.stdout)
    return resolved


def test_compose_brings_up_the_fleet_with_postgres_and_sidecars(tmp_path: Path) -> None:
    services = compose_config()["services"]
    fleet = services["fleet"]
    assert fleet["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert fleet["build"]["args"]["EXTRAS"] == "postgres"
    assert parse_command(fleet["command"]).command == "fleet"
    assert fleet["ports"] == ["127.0.0.1:8470:8470/tcp"]  # loopback only: a demonstration
    sidecars = [s for name, s in services.items() if name.startswith("sidecar-")]
    simulators = [s for name, s in services.items() if name.startswith("metadata-")]
    assert len(sidecars) == len(simulators) >= 3
    for svc in sidecars + simulators + [fleet]:
        assert svc["read_only"] is True
        assert svc["cap_drop"] == ["ALL"]
        assert parse_command(svc["command"])
    # Each sidecar's configuration loads as the bridge would load it in its container.
    providers: set[str] = set()
    for svc in sidecars:
        mounts = {v.split(":")[1]: Path(v.split(":")[0]) for v in svc["volumes"]}
        config_file = mounts[str(parse_command(svc["command"]).config)]
        text = config_file.read_text()
        for target, source in mounts.items():
            text = text.replace(f"file:{target}", f"file:{source}")
        path = tmp_path / "sidecar.toml"
        path.write_text(text)
        config, _ = load_config(path, svc["environment"])
        providers.add(config.source.provider)
        (sink,) = config.sinks
        assert getattr(sink, "url", None) == "http://fleet:8470/v1/events"
    # One VM of each cloud: three identities, three rows on the fleet page.
    assert providers == {"gce", "azure", "aws"}
    simulated = {parse_command(s["command"]).provider for s in simulators}
    assert simulated == providers
    # The fleet's configuration is the PostgreSQL example, its secret the sidecars' one.
    fleet_mounts = dict(v.split(":")[:2] for v in fleet["volumes"])
    assert Path(next(k for k, v in fleet_mounts.items() if v.endswith("fleet.toml"))) == (
        EXAMPLES / "fleet-postgres.toml"
    )
    assert json.dumps(fleet["environment"]).count("PGPASSWORD") == 1
    # Every secret the fleet's configuration names is a mounted demo file, and the fleet
    # loads with those public demo values (tokens long enough, each its own).
    text = (EXAMPLES / "fleet-postgres.toml").read_text()
    mounted = {target: source for source, target in fleet_mounts.items()}
    # (a commented-out table, such as tracing's, names no file the demo mounts)
    named = re.findall(r'^[^#\n]*"file:([^"]+)"', text, re.MULTILINE)
    assert {Path(mounted[target]).name for target in named} == {
        "demo-webhook-secret",
        "demo-read-token",
        "demo-eligible-token",
    }
    for target in named:
        text = text.replace(f"file:{target}", f"file:{mounted[target]}")
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    assert_reads_need_their_own_credentials(load_fleet_config(path, {}))
