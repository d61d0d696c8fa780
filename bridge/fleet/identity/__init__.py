"""Which VM a sidecar runs on, as its cloud vouches for it: the fleet side of attestation.

A shared webhook secret lets any VM speak for every other; here each cloud's signed identity
document (GCE's identity token, Azure's managed-identity token or attested document, AWS's
instance identity document) is verified once, at enrollment, against trust material given as
files (`trust`), and earns the sidecar a credential bound to that instance (`credential`);
events are then accepted only about that instance (`binding`). Pure library: nothing here
listens or stores, so every check is testable on its own. Imports PyJWT, `cryptography` and
asn1crypto only when identity is configured.
"""
