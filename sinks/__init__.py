"""Sink plugins: each module holds one sink's configuration model and its `create` factory.

A sink module must import its cloud SDK only inside the sink, never at module level: the
configuration of every sink is validated at start-up, and a VM that publishes to a webhook
must not pay for the Pub/Sub or Event Hubs client libraries.
"""
