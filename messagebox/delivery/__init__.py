"""Messages out: what a host instance does to the store
(``consumer.Consumer``, one transaction a call: claim, record outcomes,
heartbeats, timers), with claims under a lease, the registry of host instances,
scheduled entries, service instances (orchestration state, whose steps publish
through ``routing``) and the cleanup job. Above ``routing`` and ``storage``.
"""
