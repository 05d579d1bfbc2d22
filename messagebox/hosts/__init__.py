"""Host instances: dequeuing threads that claim queue entries under a lease and hand
them to services (docs/concepts.md: Hosts), and the ports that move messages in and out.

- :class:`~messagebox.hosts.instance.HostInstance` runs one instance of a host;
- :class:`~messagebox.hosts.app.HostApp` declares a host's services, subscriptions and ports in a
  module, for ``messagebox host run module:app``;
- :class:`~messagebox.hosts.service.Delivery` is what a service receives;
- :class:`~messagebox.hosts.orchestration.Orchestration`: long-running services with persisted
  state, correlation, convoys and timeouts;
- :mod:`messagebox.hosts.ports`: receive ports and locations, send ports and send port groups.
"""

from messagebox.hosts.app import HostApp
from messagebox.hosts.dispatch import InstanceStats
from messagebox.hosts.instance import HostInstance
from messagebox.hosts.orchestration import Orchestration, activate, receive, timeout
from messagebox.hosts.ports import ReceiveLocation, ReceivePort, SendPort, SendPortGroup, Transport
from messagebox.hosts.service import Delivery

__all__ = [
    "Delivery",
    "HostApp",
    "HostInstance",
    "InstanceStats",
    "Orchestration",
    "ReceiveLocation",
    "ReceivePort",
    "SendPort",
    "SendPortGroup",
    "Transport",
    "activate",
    "receive",
    "timeout",
]
