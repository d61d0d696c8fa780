"""The simulator's signed identity endpoints, read with plain HTTP as a sidecar would, and
verified by the fleet's library (`bridge.fleet.identity.verify`): each cloud's document is
accepted and names the simulated instance; each attestation fault is refused with its reason.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from bridge.fleet.identity import verify
from bridge.fleet.identity.model import AttestationError
from bridge.fleet.identity.trust import TrustFiles
from bridge.simulator import Simulator

from .documents import AUDIENCE, AZURE, GOOGLE, aws_document, azure_attested, azure_token, gce_token

# -- each cloud's document verifies and names the instance ------------------------------------


async def test_gce_identity_token_names_the_instance(
    sim: Simulator, client: httpx.AsyncClient, trust: TrustFiles, policy: verify.Policy
) -> None:
    answer = await gce_token(sim, client)
    assert answer.status_code == 200
    assert answer.headers["Metadata-Flavor"] == "Google"
    attested = verify.gce(answer.text, trust, policy)
    ident = sim.identity.gce
    assert attested.id == str(ident.instance_id)
    assert attested.name == ident.instance_name
    assert attested.project == ident.project_id
    assert attested.zone == ident.zone
    assert attested.source == (
        f"//compute.googleapis.com/projects/{ident.project_id}/zones/{ident.zone}"
        f"/instances/{ident.instance_name}"
    )


async def test_gce_identity_needs_an_audience_and_a_service_account(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    url = f"{sim.gce_url}instance/service-accounts/default/identity"
    assert (await client.get(url, headers=GOOGLE)).status_code == 400
    assert (await client.get(url, params={"audience": AUDIENCE})).status_code == 403
    sim.identity = sim.identity.replace("gce", type(sim.identity.gce)(service_account=""))
    assert (await client.get(url, params={"audience": AUDIENCE}, headers=GOOGLE)).status_code == 404


async def test_a_gce_token_without_format_full_names_no_instance(
    sim: Simulator, client: httpx.AsyncClient, trust: TrustFiles, policy: verify.Policy
) -> None:
    answer = await client.get(
        f"{sim.gce_url}instance/service-accounts/default/identity",
        params={"audience": AUDIENCE},
        headers=GOOGLE,
    )
    with pytest.raises(AttestationError, match="format=full"):
        verify.gce(answer.text, trust, policy)


async def test_azure_managed_identity_token_names_the_vm(
    sim: Simulator, client: httpx.AsyncClient, trust: TrustFiles, policy: verify.Policy
) -> None:
    answer = await azure_token(sim, client)
    assert answer.status_code == 200
    body = answer.json()
    assert body["token_type"] == "Bearer"
    assert body["resource"] == AUDIENCE
    attested = verify.azure_token(body["access_token"], trust, policy)
    assert attested.resource_id == sim.identity.azure.resource_id
    assert attested.subscription == sim.identity.azure.subscription_id
    assert attested.name == sim.identity.azure.name


async def test_azure_token_endpoint_refusals(sim: Simulator, client: httpx.AsyncClient) -> None:
    url = f"{sim.base_url}/metadata/identity/oauth2/token"
    missing = await client.get(url, params={"api-version": "2018-02-01"}, headers=AZURE)
    assert missing.status_code == 400
    assert "resource" in missing.json()["error_description"]
    no_header = await client.get(url, params={"api-version": "2018-02-01", "resource": "x"})
    assert no_header.status_code == 400
    sim.identity = sim.identity.replace("azure", type(sim.identity.azure)(managed_identity=False))
    answer = await azure_token(sim, client)
    assert answer.status_code == 400
    assert answer.json()["error_description"] == "Identity not found"


async def test_azure_attested_document_names_the_vm(
    sim: Simulator, client: httpx.AsyncClient, trust: TrustFiles, policy: verify.Policy
) -> None:
    nonce = str(int(time.time()))
    answer = await azure_attested(sim, client, nonce)
    assert answer.status_code == 200
    assert answer.json()["encoding"] == "pkcs7"
    attested = verify.azure_attested(answer.json()["signature"], nonce, trust, policy)
    assert attested.id == sim.identity.azure.vm_id
    assert attested.subscription == sim.identity.azure.subscription_id


async def test_aws_identity_document_and_signature(
    sim: Simulator, client: httpx.AsyncClient, trust: TrustFiles
) -> None:
    document, signature = await aws_document(sim, client)
    attested = verify.aws(document, signature, trust)
    ident = sim.identity.aws
    assert attested.id == ident.instance_id
    assert attested.account == ident.account_id
    assert attested.location == ident.region
    assert attested.source is None  # the ARN is claimed at enrollment and checked then


async def test_aws_pkcs7_documents_verify_as_cms(
    sim: Simulator, client: httpx.AsyncClient, trust: TrustFiles
) -> None:
    """`rsa2048` is a CMS SignedData holding the document (checked against the signing
    certificate's own CA: AWS's is self-signed, the simulator's is issued)."""
    import base64

    from bridge.fleet.identity.pkcs7 import signed_content

    token = await client.put(
        f"{sim.base_url}/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "9"}
    )
    headers = {"X-aws-ec2-metadata-token": token.text}
    base = f"{sim.base_url}/latest/dynamic/instance-identity"
    document = (await client.get(f"{base}/document", headers=headers)).text
    signed = (await client.get(f"{base}/rsa2048", headers=headers)).text
    material = (await client.get(f"{sim.base_url}/_sim/identity/trust")).json()
    from cryptography import x509

    ca = x509.load_pem_x509_certificate(material["ca_pem"].encode())
    content = signed_content(base64.b64decode(signed), [ca], material["signer_name"])
    assert content.decode() == document


# -- each fault is refused, with its reason ---------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("expired", "token expired"),
        ("wrong_audience", "audience"),
        ("bad_signature", "signature does not verify"),
    ],
)
async def test_gce_faults_are_refused(
    sim: Simulator,
    client: httpx.AsyncClient,
    trust: TrustFiles,
    policy: verify.Policy,
    fault: str,
    reason: str,
) -> None:
    sim.faults.set("gce", attestation=fault)
    answer = await gce_token(sim, client)
    with pytest.raises(AttestationError, match=reason):
        verify.gce(answer.text, trust, policy)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("expired", "token expired"),
        ("wrong_audience", "audience"),
        ("bad_signature", "signature does not verify"),
    ],
)
async def test_azure_token_faults_are_refused(
    sim: Simulator,
    client: httpx.AsyncClient,
    trust: TrustFiles,
    policy: verify.Policy,
    fault: str,
    reason: str,
) -> None:
    sim.faults.set("azure", attestation=fault)
    token = (await azure_token(sim, client)).json()["access_token"]
    with pytest.raises(AttestationError, match=reason):
        verify.azure_token(token, trust, policy)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("expired", "expired"),
        ("wrong_audience", "nonce is not the one asked for"),
        ("bad_signature", "not trusted"),
    ],
)
async def test_azure_attested_faults_are_refused(
    sim: Simulator,
    client: httpx.AsyncClient,
    trust: TrustFiles,
    policy: verify.Policy,
    fault: str,
    reason: str,
) -> None:
    sim.faults.set("azure", attestation=fault)
    nonce = str(int(time.time()))
    signature = (await azure_attested(sim, client, nonce)).json()["signature"]
    with pytest.raises(AttestationError, match=reason):
        verify.azure_attested(signature, nonce, trust, policy)


async def test_an_old_nonce_is_refused(
    sim: Simulator, client: httpx.AsyncClient, trust: TrustFiles, policy: verify.Policy
) -> None:
    nonce = str(int(time.time()) - 3600)
    signature = (await azure_attested(sim, client, nonce)).json()["signature"]
    with pytest.raises(AttestationError, match="older than"):
        verify.azure_attested(signature, nonce, trust, policy)


async def test_aws_bad_signature_is_refused(
    sim: Simulator, client: httpx.AsyncClient, trust: TrustFiles
) -> None:
    sim.faults.set("aws", attestation="bad_signature")
    document, signature = await aws_document(sim, client)
    with pytest.raises(AttestationError, match="does not verify"):
        verify.aws(document, signature, trust)
    with pytest.raises(AttestationError, match="does not verify"):
        verify.aws(document.replace("i-", "i-0"), (await aws_document(sim, client))[1], trust)


async def test_wrong_resource_and_other_vm_still_verify_but_name_another_vm(
    sim: Simulator, client: httpx.AsyncClient, trust: TrustFiles, policy: verify.Policy
) -> None:
    """These documents are genuine: the binding, not the signature, refuses them (403)."""
    sim.faults.set("azure", attestation="wrong_resource")
    token = (await azure_token(sim, client)).json()["access_token"]
    assert "/resourceGroups/other-rg/" in str(verify.azure_token(token, trust, policy).source)
    sim.faults.set("gce", attestation="other_vm")
    assert verify.gce((await gce_token(sim, client)).text, trust, policy).name == "sim-vm-other"
    sim.faults.set("aws", attestation="other_vm")
    assert verify.aws(*await aws_document(sim, client), trust).id == "i-0fedcba9876543210"


async def test_replayed_aws_document_is_the_first_one_served(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    first = await aws_document(sim, client)
    sim.identity = sim.identity.replace("aws", type(sim.identity.aws)(instance_id="i-0aaaa"))
    sim.faults.set("aws", attestation="replayed")
    assert await aws_document(sim, client) == first


async def test_unknown_attestation_faults_are_refused_with_the_known_ones(sim: Simulator) -> None:
    with pytest.raises(ValueError, match="'bad_signature', 'other_vm' or 'replayed'"):
        sim.faults.set("aws", attestation="expired")


def rewrite(trust: TrustFiles, text: str) -> None:
    """Rewrite the JWKS file in place, as a key-fetching job does."""
    Path(str(trust.gce_jwks).removeprefix("file:")).write_text(text)


async def test_trust_files_are_reread_when_rotated(
    sim: Simulator, client: httpx.AsyncClient, trust: TrustFiles, policy: verify.Policy
) -> None:
    """A file rewritten with other keys is picked up at the next verification; a half-written
    one is logged and the previous keys stay."""
    token = (await gce_token(sim, client)).text
    verify.gce(token, trust, policy)
    rewrite(trust, '{"keys": ')
    verify.gce(token, trust, policy)  # the previous keys
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    rewrite(trust, f'{{"keys": [{jwt.algorithms.RSAAlgorithm.to_jwk(other)}]}}')
    with pytest.raises(AttestationError, match="unknown key"):
        verify.gce(token, trust, policy)
