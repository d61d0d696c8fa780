"""Fleet coordination: a maintenance budget (at most N members of a group in a disruptive
action at once) and leader step-down, through an existing coordination engine.

Every sidecar acts alone otherwise: each VM that gets a notice drains at once, so a notice
for a whole group drains the whole group. The budget is a counting semaphore kept by the
engine (etcd, the first backend), whose slots live on leases: a holder that dies loses its
slot when its lease expires, so no lock is ever stuck on a vanished VM.

Nothing here is imported unless `[coordination]` is configured (or `elect` runs): the
sidecar's `run` path stays as lean as without it.

- `settings`: the `[coordination]` table.
- `backend`: what the bridge needs of an engine (the interface a second engine implements).
- `etcd`: the etcd v3 client (the JSON gateway over bridge/infra/http1.py) and the etcd backend.
- `budget`: the policy the actions engine calls: wait for a slot, time out, hold, release.
- `lease_timing`: the renewal, timeout and deadline rules of every lease holder (a slot's,
  `elect`'s leader), derived from the TTL.
- `elect`: `maintenance-bridge elect`, an etcd election that never leads on a VM about to
  go away, whose command never outlives it nor its lease, with a fencing token.
"""
