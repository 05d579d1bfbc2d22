"""Adapters found by URL scheme, option parsing, the file adapter's URLs and atomic
writes, and the HTTP send adapter against a real local server (no database)."""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from messagebox.adapters import receive_adapter, schemes, send_adapter
from messagebox.adapters.base import Outbound, SendAdapter, parse_options
from messagebox.adapters.file import FileReceive, FileSend
from messagebox.adapters.http import HttpReceive, HttpSend
from messagebox.errors import UnknownAdapter, ValidationError
from tests.conftest import wait_for

MESSAGE_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def outbound(
    *,
    message_id: uuid.UUID = MESSAGE_ID,
    port: str = "out",
    message_type: str | None = "urn:orders#Order",
    properties: dict[str, object] | None = None,
) -> Outbound:
    return Outbound(
        message_id=message_id,
        port=port,
        message_type=message_type,
        properties=properties or {},
    )


@pytest.fixture
def senders() -> Iterator[Callable[..., SendAdapter]]:
    """Makes send adapters by URL and closes them all afterwards."""
    made: list[SendAdapter] = []

    def make(url: str, **options: object) -> SendAdapter:
        adapter = send_adapter(url, **options)
        made.append(adapter)
        return adapter

    yield make
    for adapter in made:
        adapter.close()


# --- the registry -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "cls"),
    [
        ("file:///data/in?mask=*.xml", FileReceive),
        ("FILE:///data/in", FileReceive),
        ("http://127.0.0.1:0/orders", HttpReceive),
    ],
    ids=["file", "upper-case-scheme", "http"],
)
def test_a_receive_adapter_is_picked_by_scheme(url: str, cls: type) -> None:
    adapter = receive_adapter(url)

    assert type(adapter) is cls
    assert adapter.url == url


@pytest.mark.parametrize(
    ("url", "cls"),
    [
        ("file:///data/out/%MessageID%.xml", FileSend),
        ("http://127.0.0.1:9/orders", HttpSend),
        ("https://partner.example/orders", HttpSend),
    ],
    ids=["file", "http", "https"],
)
def test_a_send_adapter_is_picked_by_scheme(
    senders: Callable[..., SendAdapter], url: str, cls: type
) -> None:
    adapter = senders(url)

    assert type(adapter) is cls
    assert adapter.url == url


def test_the_known_schemes_are_listed_for_each_direction() -> None:
    assert schemes() == {"receive": ["file", "http"], "send": ["file", "http", "https"]}


@pytest.mark.parametrize("pick", [receive_adapter, send_adapter], ids=["receive", "send"])
def test_an_unknown_scheme_is_refused_listing_the_known_ones(pick: Callable[..., Any]) -> None:
    with pytest.raises(UnknownAdapter) as info:
        pick("ftp://x")

    assert "'ftp'" in str(info.value)
    assert "known schemes: file, http" in str(info.value)


@pytest.mark.parametrize("url", ["/data/in", "", "file:/data/in", "data"])
@pytest.mark.parametrize("pick", [receive_adapter, send_adapter], ids=["receive", "send"])
def test_an_address_that_is_not_a_url_is_refused(pick: Callable[..., Any], url: str) -> None:
    with pytest.raises(UnknownAdapter, match="is not a URL; known schemes: file"):
        pick(url)


def test_an_unknown_adapter_is_a_validation_error() -> None:
    with pytest.raises(ValidationError):
        send_adapter("ftp://x")


# --- parse_options ----------------------------------------------------------------------

KNOWN = {"name": "x", "count": 1, "ratio": 1.0, "flag": False}


def test_options_not_given_keep_their_defaults() -> None:
    assert parse_options("u://", KNOWN, {}) == KNOWN


@pytest.mark.parametrize(
    ("query", "name", "value"),
    [
        ("count=5", "count", 5),
        ("count=-2", "count", -2),
        ("ratio=0.25", "ratio", 0.25),
        ("ratio=3", "ratio", 3.0),
        ("flag=true", "flag", True),
        ("flag=YES", "flag", True),
        ("flag=1", "flag", True),
        ("flag=no", "flag", False),
        ("flag=0", "flag", False),
        ("name=a%20b", "name", "a b"),
        ("name=", "name", ""),
    ],
)
def test_a_query_option_is_typed_like_its_default(query: str, name: str, value: object) -> None:
    options = parse_options("u://", KNOWN, {}, query=query)

    assert options[name] == value
    assert type(options[name]) is type(value)


def test_a_keyword_option_wins_over_the_query() -> None:
    options = parse_options("u://", KNOWN, {"count": "7"}, query="count=5&ratio=2")

    assert options["count"] == 7
    assert options["ratio"] == 2.0


def test_an_unknown_option_is_refused_by_name_listing_the_known_ones() -> None:
    with pytest.raises(ValidationError) as info:
        parse_options("u://here", KNOWN, {}, query="colour=red")

    assert "unknown option 'colour'" in str(info.value)
    assert "known: count, flag, name, ratio" in str(info.value)
    assert "u://here" in str(info.value)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("count=many", "count='many' is not a int"),
        ("count=1.5", "count='1.5' is not a int"),
        ("ratio=fast", "ratio='fast' is not a float"),
        ("flag=maybe", "flag='maybe' is not a bool"),
    ],
)
def test_a_bad_option_value_is_refused_naming_the_option(query: str, named: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(named)):
        parse_options("u://", KNOWN, {}, query=query)


# --- FileSend: macros -----------------------------------------------------------------------


def file_url(path: Path | str) -> str:
    return f"file://{path}"


def test_the_file_macros_expand_into_the_file_name(tmp_path: Path) -> None:
    # Given a path using every per-message macro
    adapter = FileSend(file_url(tmp_path / "%Port%-%MessageType%-%SourceFileName%-%MessageID%.x"))

    # When a message received from a file is sent
    where = adapter.send(
        b"<o/>", outbound(properties={"messagebox.ReceivedFileName": "order7.xml"})
    )

    # Then the file is named from the message, and holds its body
    name = f"out-urn_orders#Order-order7.xml-{MESSAGE_ID}.x"
    assert where == str(tmp_path / name)
    assert (tmp_path / name).read_bytes() == b"<o/>"


def test_macro_values_with_slashes_are_made_safe(tmp_path: Path) -> None:
    # Given values that would climb out of the folder or into sub-folders
    adapter = FileSend(file_url(tmp_path / "out" / "%Port%_%SourceFileName%"))
    message = outbound(
        port="a/b\\c", properties={"messagebox.ReceivedFileName": "../../etc/passwd"}
    )

    # When it is sent
    where = Path(adapter.send(b"x", message))

    # Then the file is straight in the folder
    assert where.parent == tmp_path / "out"
    assert where.name == "a_b_c_.._.._etc_passwd"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a_b_c_.._.._etc_passwd", "out"]


def test_the_source_file_name_is_the_message_id_without_a_received_file() -> None:
    adapter = FileSend("file:///out/%SourceFileName%.xml")

    assert adapter.path_for(outbound()) == Path(f"/out/{MESSAGE_ID}.xml")


def test_a_message_without_a_type_is_named_unknown() -> None:
    adapter = FileSend("file:///out/%MessageType%.xml")

    assert adapter.path_for(outbound(message_type=None)) == Path("/out/unknown.xml")


def test_an_unknown_macro_is_refused_at_construction() -> None:
    with pytest.raises(ValidationError) as info:
        FileSend("file:///out/%Customer%.xml")

    assert "unknown macro %Customer%" in str(info.value)
    assert "%MessageID%" in str(info.value)


def test_the_datetime_macro_expands() -> None:
    adapter = FileSend("file:///out/%datetime%.xml")

    name = adapter.path_for(outbound()).name

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d{6}\.xml", name), name


def test_the_time_macro_expands() -> None:
    adapter = FileSend("file:///out/%time%.xml")

    assert re.fullmatch(r"\d{6}\.xml", adapter.path_for(outbound()).name)


def test_a_path_ending_in_a_slash_names_the_file_by_message_id(tmp_path: Path) -> None:
    adapter = FileSend(file_url(tmp_path) + "/")

    where = adapter.send(b"body", outbound())

    assert where == str(tmp_path / str(MESSAGE_ID))
    assert (tmp_path / str(MESSAGE_ID)).read_bytes() == b"body"


# --- FileSend: writing ----------------------------------------------------------------------


def test_a_sent_file_leaves_no_temporary_file_behind(tmp_path: Path) -> None:
    adapter = FileSend(file_url(tmp_path / "%MessageID%.xml"))

    adapter.send(b"<o/>", outbound())

    assert os.listdir(tmp_path) == [f"{MESSAGE_ID}.xml"]


def test_overwrite_replaces_an_existing_file(tmp_path: Path) -> None:
    # Given a file already where the message goes
    target = tmp_path / "out.xml"
    target.write_bytes(b"old")
    adapter = FileSend(file_url(target) + "?mode=overwrite")

    # When the message is sent
    adapter.send(b"new", outbound())

    # Then the file holds the new body, and nothing else is left
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["out.xml"]


def test_overwrite_is_the_default_mode(tmp_path: Path) -> None:
    target = tmp_path / "out.xml"
    target.write_bytes(b"old")

    FileSend(file_url(target)).send(b"new", outbound())

    assert target.read_bytes() == b"new"


def test_create_fails_when_the_file_exists_and_keeps_it(tmp_path: Path) -> None:
    # Given a file already where the message goes
    target = tmp_path / "out.xml"
    target.write_bytes(b"old")
    adapter = FileSend(file_url(target), mode="create")

    # When the message is sent
    with pytest.raises(FileExistsError):
        adapter.send(b"new", outbound())

    # Then the file is untouched, and no temporary file is left
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.xml"]


def test_create_writes_a_new_file(tmp_path: Path) -> None:
    adapter = FileSend(file_url(tmp_path / "%MessageID%"), mode="create", fsync=False)

    adapter.send(b"new", outbound())

    assert os.listdir(tmp_path) == [str(MESSAGE_ID)]
    assert (tmp_path / str(MESSAGE_ID)).read_bytes() == b"new"


def test_mkdir_creates_missing_folders(tmp_path: Path) -> None:
    adapter = FileSend(file_url(tmp_path / "a" / "b" / "%Port%" / "m.xml"))

    adapter.send(b"x", outbound(port="p1"))

    assert (tmp_path / "a" / "b" / "p1" / "m.xml").read_bytes() == b"x"


def test_without_mkdir_a_missing_folder_fails_the_send(tmp_path: Path) -> None:
    adapter = FileSend(file_url(tmp_path / "missing" / "m.xml") + "?mkdir=false")

    with pytest.raises(FileNotFoundError):
        adapter.send(b"x", outbound())

    assert os.listdir(tmp_path) == []


def test_file_send_options_are_typed() -> None:
    adapter = FileSend("file:///out/?fsync=false&mkdir=0&mode=create")

    assert (adapter.fsync, adapter.mkdir, adapter.mode) == (False, False, "create")


@pytest.mark.parametrize(
    ("url", "culprit"),
    [
        ("file:///out/?mode=append", "mode must be overwrite or create"),
        ("file:///out/?fsync=perhaps", "fsync='perhaps' is not a bool"),
        ("file:///out/?colour=red", "unknown option 'colour'"),
        ("file://server/share/out/", "names a local path"),
    ],
    ids=["mode", "fsync", "unknown", "remote-host"],
)
def test_a_bad_file_send_url_is_refused(url: str, culprit: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(culprit)):
        FileSend(url)


# --- FileReceive: URLs --------------------------------------------------------------------------


def test_file_receive_defaults() -> None:
    adapter = FileReceive("file:///data/in")

    assert adapter.folder == Path("/data/in")
    assert adapter.mask == "*"
    assert (adapter.interval, adapter.batch, adapter.archive) == (1.0, 100, None)
    assert adapter.recover_interval == 10.0


def test_the_mask_comes_from_the_query() -> None:
    adapter = FileReceive("file:///data/in?mask=*.xml")

    assert (adapter.folder, adapter.mask) == (Path("/data/in"), "*.xml")


@pytest.mark.parametrize(
    ("segment", "mask"),
    [("*.xml", "*.xml"), ("order-%3F%3F.json", "order-??.json"), ("[ab]*", "[ab]*")],
    ids=["star", "escaped-question-marks", "brackets"],
)
def test_the_mask_comes_from_the_last_path_segment(segment: str, mask: str) -> None:
    # ('?' starts a URL's query, so in the path it is written %3F)
    adapter = FileReceive(f"file:///data/in/{segment}")

    assert (adapter.folder, adapter.mask) == (Path("/data/in"), mask)


def test_batch_interval_and_archive_come_from_the_query() -> None:
    adapter = FileReceive(
        "file:///data/in?batch=5&interval=0.5&recover_interval=2&archive=/data/done"
    )

    assert (adapter.batch, adapter.interval, adapter.recover_interval) == (5, 0.5, 2.0)
    assert type(adapter.batch) is int
    assert adapter.archive == Path("/data/done")


def test_keyword_options_win_over_the_query() -> None:
    adapter = FileReceive("file:///data/in?batch=5", batch=7, interval=0.1)

    assert (adapter.batch, adapter.interval) == (7, 0.1)


@pytest.mark.parametrize(
    ("url", "culprit"),
    [
        ("file:///d?batch=many", "batch='many' is not a int"),
        ("file:///d?interval=soon", "interval='soon' is not a float"),
        ("file:///d?batch=0", "batch must be at least 1"),
        ("file:///d?interval=0", "interval positive"),
        ("file:///d?speed=1", "unknown option 'speed'"),
        ("file://host/d", "names a local path"),
        ("file://", "no folder"),
    ],
    ids=["batch", "interval", "zero-batch", "zero-interval", "unknown", "remote-host", "empty"],
)
def test_a_bad_file_receive_url_is_refused(url: str, culprit: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(culprit)):
        FileReceive(url)


# --- HttpSend against a real server ---------------------------------------------------------------


@dataclass
class Request:
    path: str
    body: bytes
    headers: dict[str, str]


@dataclass
class Partner:
    """A local HTTP server that records what is POSTed to it."""

    url: str
    requests: list[Request] = field(default_factory=list)
    status: int = 200
    delay: float = 0.0
    release: threading.Event = field(default_factory=threading.Event)


class _PartnerHandler(BaseHTTPRequestHandler):
    server: _PartnerServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        partner = self.server.partner
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        partner.requests.append(
            Request(self.path, body, {k.lower(): v for k, v in self.headers.items()})
        )
        if partner.delay:
            partner.release.wait(partner.delay)
        answer = b"partner is down" if partner.status >= 400 else b"thanks"
        self.send_response(partner.status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


class _PartnerServer(ThreadingHTTPServer):
    daemon_threads = False  # server_close() waits for the handlers
    partner: Partner

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (the timeout test) closed its end


@pytest.fixture
def partner() -> Iterator[Partner]:
    server = _PartnerServer(("127.0.0.1", 0), _PartnerHandler)
    host, port = server.server_address[:2]
    server.partner = Partner(url=f"http://{host!s}:{port}/orders")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.partner
    finally:
        server.partner.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def http_send(partner: Partner) -> Iterator[HttpSend]:
    adapter = HttpSend(partner.url, timeout=5.0)
    try:
        yield adapter
    finally:
        adapter.close()


def test_http_send_posts_the_body_with_the_message_id(
    partner: Partner, http_send: HttpSend
) -> None:
    # Given a partner that answers 200
    # When a message is sent
    where = http_send.send(b'<o:Order xmlns:o="urn:orders"/>', outbound())

    # Then the partner got the body, the message id, and the send says where it went
    [request] = partner.requests
    assert request.path == "/orders"
    assert request.body == b'<o:Order xmlns:o="urn:orders"/>'
    assert request.headers["x-message-id"] == str(MESSAGE_ID)
    assert where == f"{partner.url} 200"


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"<Order/>", "application/xml"),
        (b"\n  <?xml version='1.0'?><Order/>", "application/xml"),
        (b'{"id": 1}', "application/json"),
        (b" [1, 2]", "application/json"),
        (b"id=1", "application/octet-stream"),
    ],
    ids=["xml", "xml-declaration", "json-object", "json-array", "other"],
)
def test_http_send_guesses_the_content_type(
    partner: Partner, http_send: HttpSend, body: bytes, content_type: str
) -> None:
    http_send.send(body, outbound())

    [request] = partner.requests
    assert request.headers["content-type"] == content_type


def test_a_configured_content_type_wins_over_the_guess(partner: Partner) -> None:
    adapter = HttpSend(partner.url, content_type="text/csv")
    try:
        adapter.send(b"<looks-like-xml/>", outbound())
    finally:
        adapter.close()

    assert partner.requests[0].headers["content-type"] == "text/csv"


def test_an_error_status_fails_the_send_naming_it(partner: Partner, http_send: HttpSend) -> None:
    # Given a partner that answers 500
    partner.status = 500

    # When a message is sent
    with pytest.raises(OSError, match="answered 500") as info:
        http_send.send(b"{}", outbound())

    # Then the error has the status and what the partner said
    assert "Internal Server Error" in str(info.value)
    assert "partner is down" in str(info.value)


def test_no_answer_within_the_timeout_fails_the_send(partner: Partner) -> None:
    # Given a partner that takes longer to answer than the timeout
    partner.delay = 5.0
    adapter = HttpSend(partner.url, timeout=0.2)

    # When a message is sent
    try:
        with pytest.raises(httpx.TimeoutException):
            adapter.send(b"{}", outbound())
    finally:
        adapter.close()

    # Then it was received (the partner records it once it has read it) but the send did
    # not wait for the answer
    wait_for(lambda: len(partner.requests) == 1, "the partner to record the request")


def test_http_send_options_are_typed() -> None:
    adapter = HttpSend("https://partner.example/orders", timeout="2.5")
    try:
        assert adapter.timeout == 2.5
    finally:
        adapter.close()


def test_an_unknown_http_send_option_is_refused() -> None:
    with pytest.raises(ValidationError, match="unknown option 'retries'"):
        HttpSend("https://partner.example/orders", retries=3)


def test_overwrite_sends_are_synced_together_by_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a file send port that syncs (the default), overwriting
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    adapter = FileSend(file_url(tmp_path / "%Port%" / "%MessageID%"))
    # When three messages to two folders are sent
    ids = [uuid.UUID(int=i) for i in (1, 2, 3)]
    for n, port in zip(ids, ("a", "a", "b"), strict=True):
        adapter.send(b"x", outbound(message_id=n, port=port))
    # Then each file is in place at once, synced by nothing yet
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["a", "b", *map(str, ids)])
    assert synced == []
    # and flush syncs each file, then each folder once
    adapter.flush()
    files = [str(tmp_path / p / str(n)) for n, p in zip(ids, ("a", "a", "b"), strict=True)]
    assert synced == [*files, str(tmp_path / "a"), str(tmp_path / "b")]
    # and a second flush has nothing left to sync
    adapter.flush()
    assert len(synced) == 5


def test_create_mode_and_sends_of_other_threads_are_not_left_to_this_threads_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    # create mode syncs the file and its folder before send returns
    FileSend(file_url(tmp_path / "c" / "%MessageID%"), mode="create").send(b"x", outbound())
    assert len(synced) == 2
    # an overwrite send made on another thread is that thread's to flush
    adapter = FileSend(file_url(tmp_path / "o" / "%MessageID%"))
    t = threading.Thread(target=adapter.send, args=(b"x", outbound()))
    t.start()
    t.join()
    adapter.flush()
    assert len(synced) == 2


def test_an_http_receive_on_port_0_binds_a_free_port_and_a_url_without_one_port_80() -> None:
    # port 0 asks the OS for a free port (it was taken for "no port", and bound 80)
    assert HttpReceive("http://127.0.0.1:0/orders").bind == ("127.0.0.1", 0)
    assert HttpReceive("http://127.0.0.1/orders").bind == ("127.0.0.1", 80)
    assert HttpReceive("http://127.0.0.1:8081/orders").bind == ("127.0.0.1", 8081)
