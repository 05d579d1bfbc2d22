"""Host instances: dequeuing threads that claim queue entries under a lease and hand
them to services (DESIGN.md §8).

- :class:`~hosts.instance.HostInstance` runs one instance of a host;
- :class:`~hosts.app.HostApp` declares a host's services and subscriptions in a module,
  for ``messagebox host run module:app``;
- :class:`~hosts.service.Delivery` is what a service receives.
"""

from hosts.app import HostApp
from hosts.instance import HostInstance, InstanceStats
from hosts.service import Delivery

__all__ = ["Delivery", "HostApp", "HostInstance", "InstanceStats"]
