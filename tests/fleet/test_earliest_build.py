"""Today's fleet accepts what the earliest build's sidecar posts.

`tests/fixtures/upgrade/posted/requests.jsonl` holds the HTTP requests the webhook sink of
the earliest commit's build made (recorded by a receiver while that build watched the
simulator's demo scenario; tests/fixtures/upgrade/README.md). Each is posted again, as it
was, to a real fleet service: every one is accepted and its events are in the audit log
once, under their original ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.fleet.conftest import FleetFactory

POSTED = Path(__file__).parent.parent / "fixtures" / "upgrade" / "posted" / "requests.jsonl"
#: Hop-by-hop and transfer headers of the recorded request, which httpx sets itself.
_SET_BY_CLIENT = {"connection", "accept-encoding", "transfer-encoding"}


async def test_the_fleet_accepts_every_request_the_earliest_sidecar_made(
    fleet_service: FleetFactory,
) -> None:
    requests = [json.loads(line) for line in POSTED.read_text().splitlines()]
    sent: list[str] = []
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        for request in requests:
            headers = {k: v for k, v in request["headers"].items() if k not in _SET_BY_CLIENT}
            answer = await http.post(
                request["path"], content=request["body"].encode(), headers=headers
            )
            assert answer.is_success, (answer.status_code, answer.text)
            body = json.loads(request["body"])
            sent += [e["id"] for e in body] if isinstance(body, list) else [body["id"]]
        log = (await http.get("/v1/fleet/events?limit=500")).json()
        rejected = (await http.get("/v1/fleet/rejected")).json()
    assert len(sent) == len(requests) >= 10
    assert sorted(event["id"] for event in log) == sorted(set(sent))
    assert rejected["count"] == 0, rejected
