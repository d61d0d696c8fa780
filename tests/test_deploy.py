"""deploy/: the systemd unit, the Kubernetes manifests and the container image, checked offline.

Nothing here deploys: CI has no cluster, no Docker engine and no systemd as PID 1. What can
be checked without them is checked with the real tools: every manifest against the
Kubernetes schemas (`kubernetes-validate`, strict, pinned versions), the Dockerfile with
hadolint, the unit with `systemd-analyze` where it is installed. Every command the three of
them run goes through the bridge's own argument parser, every configuration through its own
loader, and the container's health check is run against a real HTTP server.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bridge import __version__
from bridge.cli import EXIT_CONFIG, build_parser
from bridge.config import Config, load_config
from bridge.pipeline.spool import DB_NAME

pytestmark = pytest.mark.posix  # systemd, the Linux container and their linters

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
DOCKERFILE = DEPLOY / "container" / "Dockerfile"
UNIT = DEPLOY / "systemd" / "maintenance-bridge.service"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: The oldest Kubernetes minor still supported by GKE and AKS that we claim, and the newest
#: whose schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")
#: A well-formed Standard Webhooks secret, for configurations that need one.
TEST_SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
#: What the downward API would put in status.podIP.
POD_IP = "10.128.0.7"


def run(*argv: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, **kwargs
    )


def bridge_args(argv: list[str]) -> Any:
    """Parse a command line with the real parser: unknown commands or flags fail the test."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"not a valid maintenance-bridge command line: {argv} (exit {exc.code})")


# -- Kubernetes ------------------------------------------------------------------------------


def kustomization() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    return data


def manifests() -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for name in kustomization()["resources"]:
        documents += [d for d in yaml.safe_load_all((KUBERNETES / name).read_text()) if d]
    return documents


def manifest(kind: str) -> dict[str, Any]:
    (found,) = [m for m in manifests() if m["kind"] == kind]
    return found


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = manifest("DaemonSet")["spec"]["template"]["spec"]
    return spec


def bridge_container() -> dict[str, Any]:
    (container,) = pod_spec()["containers"]
    return dict(container)


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet would set it on a node (secrets faked)."""
    env = {}
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        if "value" in item:
            env[item["name"]] = item["value"]
        elif source.get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[item["name"]] = POD_IP
        elif "secretKeyRef" in source:
            env[item["name"]] = TEST_SECRET
        else:
            pytest.fail(f"no stand-in for the value of {item['name']}: {source}")
    return env


def config_map_file(tmp_path: Path) -> Path:
    """The ConfigMap's config.toml, written where the test can load it, with the secret files
    the pod mounts written under tmp_path (a stand-in secret) and the paths pointed there."""
    text = manifest("ConfigMap")["data"]["config.toml"]
    mounts = {m["name"]: m["mountPath"] for m in bridge_container()["volumeMounts"]}
    for volume in pod_spec()["volumes"]:
        if "secret" in volume:
            where = tmp_path / volume["name"]
            where.mkdir()
            for item in volume["secret"]["items"]:
                (where / item["path"]).write_text(TEST_SECRET)
            text = text.replace(f"file:{mounts[volume['name']]}/", f"file:{where}/")
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def cluster_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    """The configuration a pod of the DaemonSet runs with: ConfigMap plus its environment."""
    env = container_env(bridge_container())
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # env:NAME secrets are read from the process
    config, _ = load_config(config_map_file(tmp_path), env)
    return config


def test_the_kustomization_applies_every_manifest_in_the_directory() -> None:
    on_disk = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization()["resources"]) == sorted(on_disk)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    problems = []
    for document in manifests():
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            problems.append(f"{document['kind']} {where}: {exc.message}")
    assert not problems, f"invalid for Kubernetes {version}:\n" + "\n".join(problems)


def test_kustomize_renders_the_same_valid_manifests() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomization is checked by listing only")
    result = run(kubectl, "kustomize", KUBERNETES)
    assert result.returncode == 0, result.stderr
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert sorted(d["kind"] for d in rendered) == sorted(d["kind"] for d in manifests())
    for document in rendered:
        kubernetes_validate.validate(document, KUBERNETES_VERSIONS[0], strict=True)
    (daemonset,) = [d for d in rendered if d["kind"] == "DaemonSet"]
    images = {c["image"] for c in daemonset["spec"]["template"]["spec"]["initContainers"]}
    images |= {c["image"] for c in daemonset["spec"]["template"]["spec"]["containers"]}
    assert images == {f"maintenance-bridge:{__version__}"}


def test_everything_lives_in_one_namespace_that_admits_the_daemonset() -> None:
    namespace = manifest("Namespace")
    name = namespace["metadata"]["name"]
    assert {m["metadata"].get("namespace", name) for m in manifests()} == {name}
    # hostNetwork and hostPath are refused below the "privileged" Pod Security Standard.
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_the_daemonset_reaches_the_node_metadata_service_on_every_node() -> None:
    spec = pod_spec()
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert {"operator": "Exists"} in spec["tolerations"]  # every taint, every effect
    assert spec["priorityClassName"] == "system-node-critical"
    quota = manifest("ResourceQuota")["spec"]["scopeSelector"]["matchExpressions"]
    assert {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]} in (
        quota
    )
    assert container_env(bridge_container())["GCE_METADATA_HOST"] == "169.254.169.254"


def test_the_bridge_needs_no_kubernetes_api_access() -> None:
    kinds = {m["kind"] for m in manifests()}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    assert manifest("ServiceAccount")["automountServiceAccountToken"] is False
    assert pod_spec()["automountServiceAccountToken"] is False


def test_the_pod_configuration_is_valid_for_the_bridge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = cluster_config(tmp_path, monkeypatch)
    assert config.listener.enabled
    assert config.listener.host == POD_IP
    assert [(sink.type, sink.display_name(0)) for sink in config.sinks] == [("webhook", "ops")]


def test_validate_config_accepts_the_configmap_in_the_pod_environment(tmp_path: Path) -> None:
    env = container_env(bridge_container())
    result = run(
        sys.executable,
        "-m",
        "bridge",
        "validate-config",
        config_map_file(tmp_path),
        env={**os.environ, **env},
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "valid (1 sink(s): ops;" in result.stdout


def test_the_pod_runs_the_image_entrypoint_with_the_mounted_config() -> None:
    container = bridge_container()
    assert "command" not in container  # the image's ENTRYPOINT
    args = bridge_args(container["args"])
    assert args.command == "run"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == manifest("ConfigMap")["metadata"]["name"]
    assert args.config == Path(mount["mountPath"]) / "config.toml"


def test_probes_reach_the_listener_on_the_pod_ip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = bridge_container()
    config = cluster_config(tmp_path, monkeypatch)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": config.listener.port}
    probes = {
        kind: container[kind]["httpGet"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes == {
        "startupProbe": {"path": "/healthz", "port": "http"},
        "livenessProbe": {"path": "/healthz", "port": "http"},
        "readinessProbe": {"path": "/readyz", "port": "http"},
    }
    # Azure's first Scheduled Events answer can take the whole first_call_timeout.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] > (
        config.source.azure.first_call_timeout
    )
    annotations = manifest("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(config.listener.port)


def test_the_spool_is_on_a_host_path_at_the_configured_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state_dir = str(cluster_config(tmp_path, monkeypatch).state.dir)
    (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == "state"]
    assert volume["hostPath"] == {"path": state_dir, "type": "DirectoryOrCreate"}
    for container in pod_spec()["initContainers"] + pod_spec()["containers"]:
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "state"]
        assert mount["mountPath"] == state_dir
        assert not mount.get("readOnly", False)
    assert DB_NAME == "spool.sqlite3"  # what docs/operations.md tells operators to look for


def test_a_rolling_update_never_runs_two_bridges_on_one_spool() -> None:
    strategy = manifest("DaemonSet")["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxSurge"] == 0


def test_the_bridge_runs_unprivileged_on_a_read_only_root() -> None:
    uid = dockerfile_user()
    pod = pod_spec()["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert (pod["runAsUser"], pod["runAsGroup"]) == uid
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    context = bridge_container()["securityContext"]
    assert context == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_only_the_init_container_is_root_and_only_to_hand_over_the_state_dir() -> None:
    (init,) = pod_spec()["initContainers"]
    context = init["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    uid, gid = dockerfile_user()
    (mount,) = init["volumeMounts"]
    assert init["command"] == [
        "install", "-d", "-o", str(uid), "-g", str(gid), "-m", "0700", mount["mountPath"]
    ]  # fmt: skip


def quantity(text: str) -> float:
    """A Kubernetes quantity as a number (cores or bytes), for the units used here."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "": 1}
    match = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi|)", text)
    assert match, f"unexpected quantity {text!r}"
    return float(match[1]) * units[match[2]]


def test_every_container_has_requests_within_its_limits() -> None:
    for container in pod_spec()["initContainers"] + pod_spec()["containers"]:
        resources = container["resources"]
        for resource in ("cpu", "memory"):
            request = quantity(resources["requests"][resource])
            assert 0 < request <= quantity(resources["limits"][resource]), container["name"]
    # The bridge idles at about 45 MB resident (README, "Performance"); the request covers it.
    assert quantity(bridge_container()["resources"]["requests"]["memory"]) >= 48 * 2**20


def test_the_manifests_deploy_this_version_of_the_image() -> None:
    image = f"maintenance-bridge:{__version__}"
    assert {c["image"] for c in pod_spec()["initContainers"] + pod_spec()["containers"]} == {image}
    assert kustomization()["images"] == [{"name": "maintenance-bridge", "newTag": __version__}]


# -- Container image ---------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    instructions = []
    for logical in re.sub(r"\\\n", " ", DOCKERFILE.read_text()).splitlines():
        line = logical.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def instruction(keyword: str) -> list[str]:
    return [rest for kw, rest in dockerfile() if kw == keyword]


def dockerfile_user() -> tuple[int, int]:
    (user,) = instruction("USER")
    uid, _, gid = user.partition(":")
    return int(uid), int(gid)


def test_the_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    # No configuration file of the machine's may relax the rules: HOME and XDG point nowhere.
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    result = run(
        hadolint,
        "--no-color",
        "--failure-threshold",
        "style",
        "--disable-ignore-pragma",
        DOCKERFILE,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_base_image_is_pinned_and_shared_by_both_stages() -> None:
    (arg,) = [a for a in instruction("ARG") if a.startswith("PYTHON_IMAGE=")]
    image = arg.partition("=")[2]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+@sha256:[0-9a-f]{64}", image), image
    assert [f.split()[0] for f in instruction("FROM")] == ["${PYTHON_IMAGE}"] * 2


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    uid, gid = dockerfile_user()
    assert min(uid, gid) > 0
    # USER is the last identity change: nothing after it runs as root.
    keywords = [kw for kw, _ in dockerfile()]
    assert "RUN" not in keywords[keywords.index("USER") :]


def test_the_image_installs_only_the_extras_chosen_at_build() -> None:
    assert 'EXTRAS=""' in instruction("ARG")
    (install,) = [r for r in instruction("RUN") if "pip install" in r]
    assert "--no-cache-dir" in install
    target = re.search(r'"(/src[^"]*)"', install)
    assert target, install
    expanded = {}
    for extras in ("", "pubsub", "pubsub,eventhubs"):
        result = run("sh", "-c", f'printf %s "{target[1]}"', env={"EXTRAS": extras})
        expanded[extras] = result.stdout
    assert expanded == {
        "": "/src",
        "pubsub": "/src[pubsub]",
        "pubsub,eventhubs": "/src[pubsub,eventhubs]",
    }
    # The extras the header offers are the package's own (but `windows`: a Linux image).
    offered = set(re.findall(r'"(\w+)"', DOCKERFILE.read_text().split("ARG PYTHON_IMAGE")[0]))
    package_extras = set(PYPROJECT["project"]["optional-dependencies"]) - {"dev", "windows"}
    assert offered - {""} == package_extras


def test_the_build_context_holds_everything_the_package_needs() -> None:
    copied = set()
    for args in instruction("COPY"):
        if not args.startswith("--from"):
            *sources, _ = args.split()
            copied |= set(sources)
    packages = {
        p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert copied == {"pyproject.toml", PYPROJECT["project"]["readme"]} | packages
    # ... and the .dockerignore next to the Dockerfile sends exactly these.
    rules = [
        line.strip()
        for line in (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for name in copied:
        assert (ROOT / name).exists(), name
        included = True
        for rule in rules:
            pattern = rule.removeprefix("!").rstrip("/")
            if re.fullmatch(pattern.replace("*", ".*"), name):
                included = rule.startswith("!")
        assert included, f"{name} is excluded from the build context"


def test_the_image_entrypoint_is_the_installed_command() -> None:
    (entrypoint,) = instruction("ENTRYPOINT")
    (cmd,) = instruction("CMD")
    assert json.loads(entrypoint) == list(PYPROJECT["project"]["scripts"])
    assert bridge_args(json.loads(cmd)).command == "run"
    result = run(sys.executable, "-m", "bridge", *json.loads(cmd), "--help", cwd=ROOT)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def health_server() -> Iterator[tuple[int, list[int]]]:
    """A real HTTP server answering /healthz with the status at the head of the list."""
    statuses: list[int] = [200]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(statuses[0] if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], statuses
    server.shutdown()
    server.server_close()


def test_the_health_check_passes_only_when_healthz_answers_2xx(
    health_server: tuple[int, list[int]],
) -> None:
    port, statuses = health_server
    (healthcheck,) = instruction("HEALTHCHECK")
    argv = json.loads(healthcheck.partition("CMD ")[2])
    assert argv[:2] == ["python", "-c"]
    assert ":9787/healthz" in argv[2]
    code = argv[2].replace(":9787/", f":{port}/")
    # A proxy in the environment must not capture the loopback request.
    env = {"http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    assert run(sys.executable, "-c", code, env=env).returncode == 0
    statuses[0] = 503
    assert run(sys.executable, "-c", code, env=env).returncode != 0
    free = code.replace(f":{port}/", ":9/")  # the discard port: nothing listens
    assert run(sys.executable, "-c", free, env=env).returncode != 0


# -- systemd -----------------------------------------------------------------------------------


def unit() -> dict[str, list[tuple[str, str]]]:
    """The unit file as systemd reads it: sections of (key, value), repeated keys kept."""
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


def service(key: str) -> str:
    values = [v for k, v in unit()["Service"] if k == key]
    assert values, f"{key}= is not set"
    return values[-1]


def test_the_unit_is_hardened() -> None:
    expected = {
        "User": "maintenance-bridge",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "",
        "AmbientCapabilities": "",
        "RestrictSUIDSGID": "yes",
        "SystemCallArchitectures": "native",
        "UMask": "0077",
        "StateDirectory": "maintenance-bridge",
        "StateDirectoryMode": "0700",
        "Restart": "on-failure",
    }
    assert {key: service(key) for key in expected} == expected
    assert "DynamicUser" not in dict(unit()["Service"])


def test_the_unit_pins_the_state_dir_to_its_state_directory() -> None:
    environment = dict(
        item.split("=", 1) for k, v in unit()["Service"] if k == "Environment" for item in [v]
    )
    state_dir = f"/var/lib/{service('StateDirectory')}"
    assert environment["MAINTENANCE_BRIDGE__STATE__DIR"] == state_dir
    assert str(Config().state.dir) == state_dir  # the default agrees


def test_the_unit_does_not_restart_on_a_configuration_error() -> None:
    assert str(EXIT_CONFIG) in service("RestartPreventExitStatus").split()
    timeout = float(service("TimeoutStopSec").removesuffix("s"))
    assert timeout > Config().delivery.shutdown_timeout


def test_the_unit_runs_a_real_command_with_its_configuration() -> None:
    argv = shlex.split(service("ExecStart"))
    assert Path(argv[0]).name in PYPROJECT["project"]["scripts"]
    args = bridge_args(argv[1:])
    assert args.command == "run"
    assert args.config.parent == Path("/etc") / service("ConfigurationDirectory")
    env_file = service("EnvironmentFile")
    assert env_file.startswith("-")  # optional
    assert Path(env_file[1:]).parent == args.config.parent


def test_sysusers_creates_the_unit_user_with_the_state_dir_as_home() -> None:
    lines = [
        shlex.split(line)
        for line in (DEPLOY / "systemd" / "maintenance-bridge.sysusers").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(lines) == 1
    kind, name, _id, _gecos, home, shell = lines[0]
    assert (kind, name, home, shell) == (
        "u",
        service("User"),
        f"/var/lib/{service('StateDirectory')}",
        "/usr/sbin/nologin",
    )


def test_the_env_file_examples_are_valid_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (DEPLOY / "systemd" / "maintenance-bridge.env").read_text()
    assert all(not line or line.startswith("#") for line in text.splitlines())  # sets nothing
    examples = dict(
        line[1:].split("=", 1) for line in text.splitlines() if re.match(r"#[A-Z][A-Z0-9_]*=", line)
    )
    assert "WEBHOOK_SECRET" in examples
    for name, value in examples.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "config.toml"
    path.write_text(
        '[[sinks]]\ntype = "webhook"\nurl = "https://hooks.example.com/m"\n'
        'signing = "standard"\nsecrets = ["env:WEBHOOK_SECRET"]\n'
    )
    config, _ = load_config(path, examples)
    assert config.source.provider == "gce"
    assert config.source.azure.poll_interval == 0.5
    assert config.delivery.shutdown_timeout == 15
    assert config.listener.port == 9787


def unit_for_this_machine(tmp_path: Path) -> Path:
    """The unit with ExecStart at this environment's real script (verify checks it exists)."""
    script = Path(sys.executable).parent / "maintenance-bridge"
    assert script.exists()
    path = tmp_path / UNIT.name
    path.write_text(
        UNIT.read_text().replace("/opt/maintenance-bridge/bin/maintenance-bridge", str(script))
    )
    return path


def systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed; the unit is checked by parsing only")
    return tool


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    path = unit_for_this_machine(tmp_path)
    result = run(systemd_analyze(), "verify", "--man=no", path)
    complaints = [line for line in result.stderr.splitlines() if path.name in line]
    assert result.returncode == 0, result.stderr
    assert not complaints, result.stderr


def test_systemd_analyze_rates_the_unit_exposure_low(tmp_path: Path) -> None:
    path = unit_for_this_machine(tmp_path)
    # Exposure is 0 (locked down) to 10 (unprotected); 2.0 and below is systemd's "OK".
    result = run(systemd_analyze(), "security", "--offline=yes", "--threshold=20", path)
    if "offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze cannot rate a unit file offline (systemd < 250)")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


# -- docs/operations.md ----------------------------------------------------------------------


def documented_command_lines() -> list[list[str]]:
    """Every maintenance-bridge command line of the operations page, as argv after the name.

    Found in shell blocks (run directly, through `mb`, after `exec ... --`, or as the
    arguments of the image in `docker run`) and in inline code spans.
    """
    text = (ROOT / "docs" / "operations.md").read_text()
    commands: list[list[str]] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            tokens = shlex.split(line.partition("#")[0])
            for index, token in enumerate(tokens):
                before = tokens[index - 1] if index else ""
                starts = all(re.fullmatch(r"[A-Z_0-9]+=\S*", t) for t in tokens[:index])
                if (
                    (Path(token).name == "maintenance-bridge" and (starts or before == "--"))
                    or (token == "mb" and index == 0)
                    or (token.startswith("maintenance-bridge:") and tokens[:2] == ["docker", "run"])
                ):
                    argv = []
                    for arg in tokens[index + 1 :]:
                        if arg in {";", "&&", "||", "|", "$@"}:
                            break
                        argv.append(arg)
                    if argv:
                        commands.append(argv)
    for span in re.findall(r"`maintenance-bridge ([^`]+)`", text):
        commands.append(shlex.split(span))
    return commands


def test_every_command_on_the_operations_page_is_real() -> None:
    commands = documented_command_lines()
    assert len(commands) >= 8
    names = set()
    for argv in commands:
        names.add(bridge_args(argv).command)
    assert {"run", "simulate", "spool", "validate-config", "demo", "doctor"} <= names


# -- checkov (both halves: this directory and deploy/kubernetes/fleet) -------------------------


def test_checkov_finds_nothing_in_the_manifests_but_what_they_justify(tmp_path: Path) -> None:
    """No root, a read-only root filesystem, limits set, and every other check of checkov's
    Kubernetes policies: each finding is fixed or skipped in the manifest with its reason."""
    # checkov lives in a virtual environment of its own (the Makefile's `test` makes it): it
    # pins libraries older than the development tools need.
    checkov = Path(sys.executable).parent.parent / "checkov" / "bin" / "checkov"
    if not checkov.exists():
        message = f"checkov is not installed at {checkov}: `make test` installs it"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    # Offline: --skip-download fetches nothing from the vendor's service, and the two
    # variables stop the PyPI version check and the guideline mapping download.
    offline = {"CKV_SKIP_PACKAGE_UPDATE_CHECK": "true", "BC_SKIP_MAPPING": "true"}
    result = run(
        checkov, "--directory", KUBERNETES, "--framework", "kubernetes", "--skip-download",
        "--output", "json", cwd=ROOT,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", **offline},
    )  # fmt: skip
    report = json.loads(result.stdout)
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert not failed, failed
    assert report["summary"]["parsing_errors"] == 0
    for check in report["results"]["skipped_checks"]:
        reason = check["check_result"].get("suppress_comment", "")
        assert len(reason.split()) >= 10, f"{check['check_id']} skipped without a reason"
    passed = {c["check_id"] for c in report["results"]["passed_checks"]}
    # The checks the project promises by name.
    assert {"CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_23", "CKV_K8S_11", "CKV_K8S_13"} <= passed
    kinds = {c["resource"].split(".")[0] for c in report["results"]["passed_checks"]}
    assert {"DaemonSet", "Deployment"} <= kinds
