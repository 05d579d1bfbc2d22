"""A host application: the services and subscriptions one host runs, declared in a
Python module, for ``messagebox host run module:app``.

    app = HostApp("shipping", dequeue_threads=2)

    @app.service("ship-eu")
    def ship(delivery: Delivery) -> None: ...

    app.subscribe("ship-eu", filter=P("orders.Region") == "EU", name="ship-eu")

Ports are declared the same way (see :mod:`messagebox.hosts.ports`):

    orders_in = app.receive_port("orders-in", route_failed=True)
    orders_in.location("drop", "file:///data/in?mask=*.xml", pipeline=XmlReceive([schema]))
    app.send_port("eu", filter=P("orders.Region") == "EU",
                  transport="file:///data/out/eu/%MessageID%.xml", retry_count=3,
                  retry_interval=60, backup="file:///data/out/backup/%MessageID%.xml")
    app.send_port_group("all-large", filter=P("orders.Total") >= 10_000, ports=["eu", "us"])

Orchestrations (see :mod:`messagebox.hosts.orchestration`) with ``app.orchestration(Fulfilment)``.

A host instance of the app runs its receive locations beside its dequeue threads; each
send port is a service with a subscription named after the port.

On start the host is created if it does not exist (with these settings), and each
declared subscription is created if no subscription of that name exists. Existing ones
are left as they are, so an operator's changes (stopping a service, say) survive a
restart; a declared filter that differs from the stored one is logged.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from messagebox.engine import MessageBox, StoreURL
from messagebox.errors import AlreadyExists, UnknownHost, UnknownSubscription, ValidationError
from messagebox.hosts.instance import HostInstance
from messagebox.hosts.orchestration import Orchestration
from messagebox.hosts.orchestration_service import OrchestrationService
from messagebox.hosts.ports import ReceivePort, SendPort, SendPortGroup, port_filter
from messagebox.models import HostSettings
from messagebox.predicates import to_filter
from messagebox.specs import check_spec

log = logging.getLogger("messagebox.hosts")

S = TypeVar("S")


class HostApp:
    """Services and subscriptions of one host, and how to run an instance of it."""

    def __init__(self, host: str, *, url: str | None = None, **settings: Any) -> None:
        self.host = host
        self.url = url
        self.settings = HostSettings.checked(f"host app {host!r}", settings)
        self.services: dict[str, object] = {}
        self.declared: list[dict[str, Any]] = []
        self.receive_ports: list[ReceivePort] = []
        self.send_ports: dict[str, SendPort] = {}
        self.send_port_groups: list[SendPortGroup] = []

    def service(self, name: str | None = None) -> Callable[[S], S]:
        """Register a function or class as a service (named after it by default)."""

        def register(target: S) -> S:
            self.add_service(name or str(getattr(target, "__name__", "")), target)
            return target

        return register

    def add_service(self, name: str, service: object) -> None:
        if not name:
            raise ValidationError("a service needs a name")
        if name in self.services:
            raise AlreadyExists(f"host app {self.host!r} registers service {name!r} twice")
        self.services[name] = service

    def subscribe(self, service: str, *, filter: object, name: str, **options: Any) -> None:
        """Declare a subscription (created at start when none of that ``name`` exists).
        Options are those of :meth:`MessageBox.subscribe`."""
        spec = {"service": service, "filter": filter, "name": name, **options}
        check_spec(repr(name), {"host": self.host, **spec})  # refused now, not at start
        self.declared.append(spec)

    def orchestration(self, cls: type[Orchestration[Any]]) -> type[Orchestration[Any]]:
        """Run an orchestration class (see :mod:`messagebox.hosts.orchestration`) in this host: a
        service named ``cls.name`` with an activation subscription per ``@activate``
        receive and an instance subscription per ``@receive``, named
        ``<name>.<receive>``. Usable as a class decorator."""
        service = OrchestrationService(cls)
        self.add_service(service.name, service)
        self.declared.extend(service.subscription_specs())
        return cls

    def receive_port(self, name: str, *, route_failed: bool = False) -> ReceivePort:
        """Declare a receive port; add locations with ``port.location(name, url, ...)``."""
        if any(p.name == name for p in self.receive_ports):
            raise AlreadyExists(f"host app {self.host!r} declares receive port {name!r} twice")
        port = ReceivePort(name, route_failed=route_failed)
        self.receive_ports.append(port)
        return port

    def send_port(self, name: str, **options: Any) -> SendPort:
        """Declare a send port (options of :class:`~messagebox.hosts.ports.SendPort`); it runs as
        the service ``name`` with a subscription of the same name."""
        port = SendPort(name, **options)
        self.add_service(name, port)
        self.send_ports[name] = port
        return port

    def send_port_group(self, name: str, *, filter: object, ports: list[str]) -> SendPortGroup:
        """Declare a group: what ``filter`` matches goes through each of ``ports``."""
        group = SendPortGroup(name, filter=filter, ports=ports)
        self.send_port_groups.append(group)
        return group

    def _port_subscriptions(self) -> list[dict[str, Any]]:
        for group in self.send_port_groups:
            unknown = [p for p in group.ports if p not in self.send_ports]
            if unknown:
                raise ValidationError(
                    f"send port group {group.name!r} names send port {unknown[0]!r}, "
                    f"which host app {self.host!r} does not declare"
                )
        specs = []
        for port in self.send_ports.values():
            filt = port_filter(port, self.send_port_groups)
            if filt is None:
                raise ValidationError(
                    f"send port {port.name!r} has no filter and is in no send port group: "
                    "it would never receive a message"
                )
            specs.append(
                {
                    "service": port.name,
                    "filter": filt,
                    "name": port.name,
                    "ordered": port.ordered,
                    "ordered_by": port.ordered_by,
                    "on_failure": "stop" if port.stop_on_failure else "suspend",
                    "priority": port.priority,
                }
            )
        return specs

    def setup(self, box: MessageBox) -> None:
        """Create the host and the declared subscriptions that do not exist yet."""
        try:
            box.host(self.host)
        except UnknownHost:
            try:
                box.create_host(self.host, self.settings)
                log.info(
                    "created host %r", self.host, extra={"event": "host-created", "host": self.host}
                )
            except AlreadyExists:
                pass  # another instance created it first
        missing = [s for s in self.declared if s["service"] not in self.services]
        if missing:
            raise ValidationError(
                f"subscription {missing[0]['name']!r} names service {missing[0]['service']!r}, "
                f"which host app {self.host!r} does not register"
            )
        existing = {s.name: s for s in box.subscriptions(host=self.host)}
        for spec in [*self.declared, *self._port_subscriptions()]:
            found = existing.get(spec["name"])
            if found is None:
                try:
                    box.subscribe(host=self.host, **spec)
                    log.info(
                        "created subscription %r",
                        spec["name"],
                        extra={
                            "event": "subscription-created",
                            "host": self.host,
                            "subscription": spec["name"],
                        },
                    )
                except AlreadyExists:
                    self._taken_elsewhere(box, spec["name"])  # else created concurrently
            elif found.filter != to_filter(spec["filter"]):
                log.warning(
                    "subscription %r exists with filter %s; the declared %s is not applied",
                    spec["name"],
                    found.filter,
                    to_filter(spec["filter"]),
                    extra={
                        "event": "subscription-differs",
                        "host": self.host,
                        "subscription": spec["name"],
                    },
                )

    def _taken_elsewhere(self, box: MessageBox, name: str) -> None:
        """Raise :class:`ValidationError` if the subscription ``name`` this app declares
        belongs to another host: subscription names are the store's, so this host's
        service would never get its messages."""
        try:
            found = box.subscription(name)
        except UnknownSubscription:
            return  # removed meanwhile: the next setup creates it
        if found.host != self.host:
            raise ValidationError(
                f"host app {self.host!r} declares subscription {name!r}, which exists on "
                f"host {found.host!r} (service {found.service!r}); subscription names are "
                "the store's: name it differently, or remove it there first"
            )

    def instance(self, url: StoreURL | None = None, **settings: Any) -> HostInstance:
        """Set up and make (not start) a host instance on ``url``."""
        box = MessageBox(url or self.url)
        try:
            self.setup(box)
            instance = HostInstance(
                box,
                self.host,
                self.services,
                settings=settings or None,
                close_box=True,
                receivers=[loc for p in self.receive_ports for loc in p.locations],
            )
            instance.on_stop.extend(p.close for p in self.send_ports.values())
            return instance
        except Exception:
            box.close()
            raise

    def run(self, url: StoreURL | None = None, **settings: Any) -> None:
        """Run one instance until SIGINT/SIGTERM."""
        self.instance(url, **settings).run()


def load_app(target: str) -> HostApp:
    """The :class:`HostApp` named by ``module:attribute`` (``attribute`` defaults to
    ``app``). The module is looked for in the working directory first, as ``python -m``
    and uvicorn do."""
    module_name, _, attribute = target.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValidationError(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attribute or "app", None)
    if not isinstance(app, HostApp):
        raise ValidationError(
            f"{target!r} is not a HostApp (got {type(app).__name__}); declare "
            "`app = HostApp(...)` in the module"
        )
    return app
