"""The VM identity the simulator serves (GCE identity keys, Azure instance metadata and the
AWS instance identity document).

Kept separate so scenarios (e.g. the vendor's WestNO_0 freeze example) and callers can
override single fields without restating the whole identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class GceIdentity:
    project_id: str = "sim-project"
    project_number: int = 123456789012
    zone: str = "us-central1-a"
    instance_id: int = 4520031799277582256
    instance_name: str = "sim-vm-1"
    machine_type: str = "e2-standard-4"

    @property
    def zone_path(self) -> str:
        """``instance/zone`` as the real server renders it."""
        return f"projects/{self.project_number}/zones/{self.zone}"

    @property
    def hostname(self) -> str:
        return f"{self.instance_name}.{self.zone}.c.{self.project_id}.internal"


_DEFAULT_SUBSCRIPTION = "8c56d827-5f07-45ce-8f2b-6c5001db5c6f"


@dataclass(frozen=True)
class AzureIdentity:
    name: str = "sim-vm-1"
    vm_id: str = "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
    subscription_id: str = _DEFAULT_SUBSCRIPTION
    resource_group_name: str = "sim-rg"
    location: str = "westeurope"
    zone: str = "1"
    vm_scale_set_name: str = ""
    vm_size: str = "Standard_D2s_v3"
    os_type: str = "Linux"
    explicit_resource_id: str = ""

    @property
    def resource_id(self) -> str:
        """ARM id of the VM, derived from subscription, group and name unless given."""
        if self.explicit_resource_id:
            return self.explicit_resource_id
        return (
            f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group_name}"
            f"/providers/Microsoft.Compute/virtualMachines/{self.name}"
        )


@dataclass(frozen=True)
class AwsIdentity:
    """The instance identity document's fields (defaults: aws/amazon-ec2-metadata-mock's, with
    the 12-digit account id of the AWS documentation's examples)."""

    instance_id: str = "i-1234567890abcdef0"
    account_id: str = "123456789012"
    region: str = "us-east-1"
    availability_zone: str = "us-east-1f"
    instance_type: str = "m4.xlarge"
    image_id: str = "ami-0a887e401f7654935"
    private_ip: str = "172.16.34.43"


@dataclass(frozen=True)
class Identity:
    gce: GceIdentity = field(default_factory=GceIdentity)
    azure: AzureIdentity = field(default_factory=AzureIdentity)
    aws: AwsIdentity = field(default_factory=AwsIdentity)


# Azure overrides may use the JSON (camelCase) names users see in /metadata/instance.
_AZURE_ALIASES = {
    "vmId": "vm_id",
    "subscriptionId": "subscription_id",
    "resourceGroupName": "resource_group_name",
    "vmScaleSetName": "vm_scale_set_name",
    "vmSize": "vm_size",
    "osType": "os_type",
    "resourceId": "explicit_resource_id",
    "resource_id": "explicit_resource_id",
}


def _apply(obj: Any, overrides: dict[str, Any], aliases: dict[str, str]) -> Any:
    allowed = {f.name for f in fields(obj)}
    clean: dict[str, Any] = {}
    for key, value in overrides.items():
        name = aliases.get(key, key)
        if name not in allowed:
            raise ValueError(f"unknown identity field {key!r} (allowed: {sorted(allowed)})")
        clean[name] = value
    return replace(obj, **clean)


# AWS overrides may use the identity document's (camelCase) names.
_AWS_ALIASES = {
    "instanceId": "instance_id",
    "accountId": "account_id",
    "availabilityZone": "availability_zone",
    "instanceType": "instance_type",
    "imageId": "image_id",
    "privateIp": "private_ip",
}


def merge_identity(base: Identity, overrides: Identity | dict[str, Any] | None) -> Identity:
    """Return ``base`` with ``overrides`` ({"gce": {...}, "azure": {...}, "aws": {...}})."""
    if overrides is None:
        return base
    if isinstance(overrides, Identity):
        return overrides
    unknown = set(overrides) - {"gce", "azure", "aws"}
    if unknown:
        raise ValueError(f"identity overrides take 'gce', 'azure' and 'aws' tables, not {unknown}")
    gce = _apply(base.gce, dict(overrides.get("gce", {})), {})
    azure = _apply(base.azure, dict(overrides.get("azure", {})), _AZURE_ALIASES)
    aws = _apply(base.aws, dict(overrides.get("aws", {})), _AWS_ALIASES)
    return Identity(gce=gce, azure=azure, aws=aws)
