"""Two host apps for one process (``messagebox host run tests.apps.pair:alpha
tests.apps.pair:beta``): alpha completes every delivery of ``t.N >= 0``; beta fails
``t.N >= 5`` (one attempt), so its entries are suspended at once."""

from __future__ import annotations

from messagebox.hosts import Delivery, HostApp
from messagebox.predicates import P

alpha = HostApp("alpha", poll_max_seconds=0.1)
alpha.subscribe("svc-a", filter=P("t.N") >= 0, name="a-all")

beta = HostApp("beta", max_attempts=1, poll_max_seconds=0.1)
beta.subscribe("svc-b", filter=P("t.N") >= 5, name="b-big")


@alpha.service("svc-a")
def complete(d: Delivery) -> None:
    pass


@beta.service("svc-b")
def refuse(d: Delivery) -> None:
    raise RuntimeError(f"beta refuses {d.message_id}")
