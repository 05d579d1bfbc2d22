"""The file adapter: receive by polling a folder, send by atomic write.

**Receive** — ``file:///data/in?mask=*.xml`` (or ``file:///data/in/*.xml``).

Options (URL query or keyword arguments):

- ``mask`` (``*``): the files to take, a shell pattern on the file name;
- ``interval`` (1.0): seconds between polls of an idle folder;
- ``batch`` (100): files taken per poll, published in one transaction;
- ``archive`` (none): a folder to move each file into once published; without it the
  file is deleted;
- ``recover_interval`` (10.0): seconds between scans for files that a dead instance
  had taken.

How no file is lost or read twice: a file is taken by renaming it to
``<name>.<token>.<instance>-<location>.mbin`` (the rename is atomic, so one receiver
wins; the tags name the host instance and the location's folder and mask). Its
messages are published together with a receipt keyed by the token, in one transaction;
only then is the file archived or deleted. After a crash, the taken file is still there;
the same location (same folder and mask) in whichever instance recovers it (the restarted one, or
any live one once the owner's heartbeat is stale) renames it to itself, finds the
receipt if the publish had committed, and then only archives it. A file that cannot be
read is suspended with what could be read and kept as ``<name>.<token>.failed``.

**Send** — ``file:///data/out/%MessageID%.xml``.

The path names the file to write, with macros: ``%MessageID%``, ``%SourceFileName%``
(the received file's name; the message id when there is none), ``%MessageType%``,
``%Port%``, ``%datetime%`` (UTC, ``YYYY-MM-DDThhmmss``) and ``%time%`` (``hhmmss``).
Options: ``mode`` (``overwrite``: replace an existing file, so a retried delivery
rewrites the same file; ``create``: fail if it exists), ``fsync`` (true: the data and
the folder entry are on disk before the delivery completes; in overwrite mode a host
instance syncs a claimed batch's files together, before it records them complete),
``mkdir`` (true: create missing folders). Each file is written to a temporary name in
its folder, then renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, ClassVar
from urllib.parse import unquote, urlsplit

from messagebox import clock
from messagebox.adapters.base import (
    Inbound,
    Outbound,
    ReceiveAdapter,
    SendAdapter,
    Sink,
    Submitted,
    parse_options,
)
from messagebox.errors import ValidationError

if TYPE_CHECKING:
    from messagebox.engine import MessageBox

log = logging.getLogger("messagebox.adapters.file")

IN_PROGRESS = ".mbin"
FAILED = ".failed"
_TAKEN = re.compile(
    r"^(?P<name>.+)\.(?P<token>[0-9a-f]{16})\.(?P<owner>[0-9a-f]{10})-(?P<loc>[0-9a-f]{6})\.mbin$"
)


def owner_tag(owner: str) -> str:
    """A short, file-name-safe tag for a host instance."""
    return hashlib.sha1(owner.encode()).hexdigest()[:10]


def location_tag(where: str) -> str:
    """A short tag for a receive location (its folder and mask)."""
    return hashlib.sha1(where.encode()).hexdigest()[:6]


def _folder_and_mask(url: str) -> tuple[Path, str | None, str]:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ValidationError(f"{url}: a file URL names a local path (file:///path)")
    path = unquote(parts.path)
    if not path:
        raise ValidationError(f"{url}: no folder")
    folder, mask = Path(path), None
    if any(c in folder.name for c in "*?["):
        folder, mask = folder.parent, folder.name
    return folder, mask, parts.query


class FileReceive(ReceiveAdapter):
    """Poll a folder for files."""

    schemes = ("file",)
    transport_type = "FILE"
    OPTIONS: ClassVar[dict[str, object]] = {
        "mask": "*",
        "interval": 1.0,
        "batch": 100,
        "archive": "",
        "recover_interval": 10.0,
    }

    def __init__(self, url: str, **options: object) -> None:
        super().__init__(url, **options)
        self.folder, mask, query = _folder_and_mask(url)
        if mask is not None:
            options = {"mask": mask, **options}
        opts = parse_options(url, self.OPTIONS, options, query=query)
        self.mask = str(opts["mask"])
        self.interval = float(opts["interval"])  # type: ignore[arg-type]
        self.batch = int(opts["batch"])  # type: ignore[call-overload]
        self.archive = Path(str(opts["archive"])) if opts["archive"] else None
        self.recover_interval = float(opts["recover_interval"])  # type: ignore[arg-type]
        if self.batch < 1 or self.interval <= 0:
            raise ValidationError(f"{url}: batch must be at least 1 and interval positive")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mine: dict[Path, tuple[str, str]] = {}  # taken path -> (name, token)
        self.stats = {"files": 0, "duplicates": 0, "suspended": 0, "recovered": 0}

    # --- lifecycle ---

    def start(self, box: MessageBox, owner: str, sink: Sink) -> None:
        if not self.folder.is_dir():
            raise ValidationError(f"{self.url}: receive folder {self.folder} does not exist")
        if self.archive is not None:
            self.archive.mkdir(parents=True, exist_ok=True)
        self._box, self._owner, self._sink = box, owner, sink
        self._loc = location_tag(f"{self.folder.resolve()}|{self.mask}")
        self._tag = f"{owner_tag(owner)}-{self._loc}"
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, name=f"file-receive:{self.folder}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("%s: still submitting after %.1f s", self.url, timeout)

    def _loop(self) -> None:
        next_recovery = 0.0
        pause = 0.0
        failures = 0
        while not self._stop.wait(pause):
            try:
                if time.monotonic() >= next_recovery:
                    self.recover()
                    next_recovery = time.monotonic() + self.recover_interval
                taken = self.poll_once()
                failures = 0
                pause = 0.0 if taken >= self.batch else self.interval
            except Exception as exc:
                failures += 1
                pause = min(self.interval * 2**failures, 60.0)
                log.error("%s: poll failed (retrying in %.1f s): %s", self.url, pause, exc)

    # --- one poll ---

    def _candidates(self, limit: int) -> list[Path]:
        found: list[tuple[float, str, Path]] = []
        with os.scandir(self.folder) as entries:
            for e in entries:
                if e.name.endswith((IN_PROGRESS, FAILED, ".tmp")) or e.name.startswith("."):
                    continue
                if not fnmatch.fnmatchcase(e.name, self.mask):
                    continue
                try:
                    if not e.is_file():
                        continue
                    found.append((e.stat().st_mtime, e.name, Path(e.path)))
                except FileNotFoundError:
                    continue
        found.sort()
        return [p for _, _, p in found[:limit]]

    def _take(self, path: Path) -> Path | None:
        token = uuid.uuid4().hex[:16]
        taken = path.with_name(f"{path.name}.{token}.{self._tag}{IN_PROGRESS}")
        try:
            os.rename(path, taken)
        except FileNotFoundError:
            return None  # another receiver took it, or it was removed
        self._mine[taken] = (path.name, token)
        return taken

    def poll_once(self) -> int:
        """Take up to ``batch`` files (after retrying any of ours still pending), publish
        them in one transaction, then archive or delete them. Returns files handled."""
        room = max(self.batch - len(self._mine), 0)
        for path in self._candidates(room) if room else []:
            self._take(path)
        if not self._mine:
            return 0
        taken = list(self._mine.items())[: self.batch]
        inputs = [self._inbound(path, name, token) for path, (name, token) in taken]
        results = self._sink.submit(inputs)  # raises: nothing stored; retried next poll
        for (path, (name, token)), result in zip(taken, results, strict=True):
            self._finish(path, name, token, result)
        return len(taken)

    def _inbound(self, path: Path, name: str, token: str) -> Inbound:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0

        def opener() -> IO[bytes]:
            return open(path, "rb")

        return Inbound(
            opener,
            size,
            key=token,
            properties={"messagebox.ReceivedFileName": name},
            name=str(self.folder / name),
        )

    def _finish(self, path: Path, name: str, token: str, result: Submitted) -> None:
        self.stats["files"] += 1
        self.stats["duplicates"] += result.duplicate
        self.stats["suspended"] += result.suspended
        try:
            if result.code == "read-failed":
                if path.exists():
                    os.rename(path, path.with_name(f"{name}.{token}{FAILED}"))
            elif self.archive is not None:
                target = self.archive / name
                if target.exists():
                    target = self.archive / f"{name}.{token}"
                os.replace(path, target)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            # published already: the receipt stops a second publish; retried next poll
            log.error(
                "%s: published %s but could not archive or delete it: %s", self.url, name, exc
            )
            return
        self._mine.pop(path, None)

    # --- crash recovery ---

    def recover(self) -> int:
        """Take over files that a dead instance had taken; returns how many."""
        live = self._live_tags()
        n = 0
        with os.scandir(self.folder) as entries:
            names = [e.name for e in entries if e.name.endswith(IN_PROGRESS)]
        for entry in names:
            m = _TAKEN.match(entry)
            if m is None or m["loc"] != self._loc:
                continue  # another location's (its receipts are under its own name)
            if self.folder / entry in self._mine or m["owner"] in live:
                continue  # ours in progress, or a live instance's
            old = self.folder / entry
            new = self.folder / f"{m['name']}.{m['token']}.{self._tag}{IN_PROGRESS}"
            try:
                if old != new:
                    os.rename(old, new)
            except FileNotFoundError:
                continue  # another instance recovered it first
            self._mine[new] = (m["name"], m["token"])
            n += 1
        if n:
            self.stats["recovered"] += n
            log.warning("%s: recovered %d files taken by instances that died", self.url, n)
        return n

    def _live_tags(self) -> set[str]:
        dead_after = {h.name: h.settings.dead_after_seconds for h in self._box.hosts()}
        ages = self._box.heartbeat_ages()  # by the database's clock, as every machine sees it
        return {
            owner_tag(i.id)
            for i in self._box.instances()
            if ages.get(i.id, float("inf")) < dead_after.get(i.host, 30.0)
        }


_MACRO = re.compile(r"%([A-Za-z_.]+)%")
MACROS = ("MessageID", "SourceFileName", "MessageType", "Port", "datetime", "time")


def _safe(text: str) -> str:
    return re.sub(r"[/\\\x00:]", "_", text) or "_"


class FileSend(SendAdapter):
    """Write each message to a file, atomically."""

    schemes = ("file",)
    OPTIONS: ClassVar[dict[str, object]] = {"mode": "overwrite", "fsync": True, "mkdir": True}

    def __init__(self, url: str, **options: object) -> None:
        super().__init__(url, **options)
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ValidationError(f"{url}: a file URL names a local path (file:///path)")
        # unquote only between macros: "%da" in "%datetime%" is not a percent-escape
        pieces = re.split(r"(%[A-Za-z_.]+%)", parts.path)
        template = "".join(p if _MACRO.fullmatch(p) else unquote(p) for p in pieces)
        if not template or template.endswith("/"):
            template += "%MessageID%"
        for macro in _MACRO.findall(template):
            if macro not in MACROS:
                raise ValidationError(
                    f"{url}: unknown macro %{macro}%; known: " + ", ".join(f"%{m}%" for m in MACROS)
                )
        opts = parse_options(url, self.OPTIONS, options, query=parts.query)
        if opts["mode"] not in ("overwrite", "create"):
            raise ValidationError(f"{url}: mode must be overwrite or create, not {opts['mode']!r}")
        self.template = template
        self.mode = str(opts["mode"])
        self.fsync = bool(opts["fsync"])
        self.mkdir = bool(opts["mkdir"])
        self._pending = threading.local()
        """Per thread: files renamed in whose data and folder entry ``flush`` syncs."""

    def path_for(self, message: Outbound) -> Path:
        now = clock.local_now()
        source = message.properties.get("messagebox.ReceivedFileName")
        values = {
            "MessageID": str(message.message_id),
            "SourceFileName": _safe(str(source)) if source else str(message.message_id),
            "MessageType": _safe(message.message_type or "unknown"),
            "Port": _safe(message.port),
            "datetime": now.strftime("%Y-%m-%dT%H%M%S"),
            "time": now.strftime("%H%M%S"),
        }
        return Path(_MACRO.sub(lambda m: values[m.group(1)], self.template))

    def send(self, body: bytes, message: Outbound) -> str:
        target = self.path_for(message)
        folder = target.parent
        if self.mkdir:
            folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
        # overwrite mode defers the syncs to flush (once a batch, one per folder): a
        # crash before it leaves the delivery incomplete, so the file is written again;
        # create mode syncs at once (a half-synced file would block its own retry)
        deferred = self.fsync and self.mode == "overwrite"
        try:
            with open(tmp, "wb") as f:
                f.write(body)
                if self.fsync and not deferred:
                    f.flush()
                    os.fsync(f.fileno())
            if self.mode == "create":
                os.link(tmp, target)  # fails if the target exists
                tmp.unlink()
            else:
                os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        if deferred:
            pending: list[Path] | None = getattr(self._pending, "files", None)
            if pending is None:
                pending = self._pending.files = []
            pending.append(target)
        elif self.fsync:
            _sync_folder(folder)
        return str(target)

    def flush(self) -> None:
        """Sync the data of the files this thread wrote since its last flush, then
        each of their folders once."""
        pending: list[Path] = getattr(self._pending, "files", None) or []
        self._pending.files = []
        for target in dict.fromkeys(pending):
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for folder in dict.fromkeys(t.parent for t in pending):
            _sync_folder(folder)


def _sync_folder(folder: Path) -> None:
    """Make a folder's entries (a rename into it) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
