"""The sidecar's enrollment without a fleet: it says why it holds no credential."""

from __future__ import annotations

import pytest

from bridge.infra.credential import EnrollmentPending, IdentitySettings
from bridge.pipeline.enrollment import Enrollment
from tests.factories import instance

SETTINGS = IdentitySettings(enroll_url="http://127.0.0.1:9/v1/enroll", audience="https://fleet")


async def test_before_the_vm_is_identified_there_is_no_credential() -> None:
    with pytest.raises(EnrollmentPending, match="not identified"):
        await Enrollment(SETTINGS).credential()


async def test_a_provider_without_an_identity_document_is_named() -> None:
    enrollment = Enrollment(SETTINGS)
    enrollment.identified("nowhere", instance("web-1"))
    with pytest.raises(EnrollmentPending, match="nowhere has no identity document"):
        await enrollment.credential()


@pytest.mark.parametrize("provider", ["gce", "azure", "aws"])
def test_each_registered_provider_attests_with_its_own_document(provider: str) -> None:
    """Found through the provider registry (`identity.py` in the provider's folder)."""
    enrollment = Enrollment(SETTINGS)
    enrollment.identified(provider, instance("web-1"))
    assert enrollment.problem == "the VM is not identified yet"


async def test_an_unreachable_fleet_is_named() -> None:
    enrollment = Enrollment(SETTINGS)

    async def attest(audience: str) -> dict[str, str]:
        return {"method": "gce_iit", "document": "x"}

    enrollment.identified("gce", instance("web-1"), attest)
    with pytest.raises(EnrollmentPending, match="cannot reach"):
        await enrollment.credential()
