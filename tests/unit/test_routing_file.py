"""The routing file: what export writes, load reads back equal (hypothesis, with
quotes, apostrophes and non-ASCII in names and filters); every file export writes is
valid under the published JSON Schema; bad files are refused naming file, line and key."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messagebox.config.routing_file import (
    Declared,
    RoutingConfig,
    RoutingFileError,
    dump,
    json_schema,
    load,
)
from messagebox.models import HostSettings, Kind, OnExpiry, OnFailure, State
from tests.strategies import filters

ROOT = Path(__file__).resolve().parents[2]

names = st.one_of(  # as check_name allows them (docs/reference.md: Names)
    st.sampled_from(["ship", "ship-eu", "zürich", "a b", "a.b", "a=b", "[x]", "a\\b", "東京"]),
    st.text(
        alphabet=st.characters(
            blacklist_categories=["Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"],
            blacklist_characters="<>&\"'`",
        ),
        min_size=1,
        max_size=8,
    ).filter(lambda name: name.strip() == name),
)
host_settings = st.builds(
    HostSettings,
    dequeue_threads=st.integers(1, 256),
    claim_batch=st.integers(1, 10_000),
    max_attempts=st.integers(1, 9),
    message_ttl_seconds=st.one_of(st.none(), st.floats(0.01, 365 * 86_400.0)),
    unserved=st.sampled_from(["warn", "refuse"]),
)


@st.composite
def configs(draw: st.DrawFn) -> RoutingConfig:
    hosts = draw(st.dictionaries(names, host_settings, min_size=1, max_size=3))
    subs: dict[str, Declared] = {}
    for name in draw(st.lists(names, max_size=5, unique=True)):
        kind = draw(st.sampled_from(list(Kind)))
        subs[name] = Declared(
            name=name,
            service=draw(names),
            host=draw(st.sampled_from(sorted(hosts))),
            filter=draw(filters),
            kind=kind,
            ordered=draw(st.booleans()),
            priority=draw(st.integers(-1000, 1000)),
            on_failure=draw(st.sampled_from(list(OnFailure))),
            correlation=("t.a",)
            if kind is Kind.INSTANCE
            else draw(st.sampled_from([(), ("t.b", "t.c")])),
            state=draw(st.sampled_from(list(State))),
            on_expiry=draw(st.sampled_from(list(OnExpiry))),
        )
    return RoutingConfig(hosts=hosts, subscriptions=subs)


@settings(max_examples=150, deadline=None)
@given(configs())
def test_what_dump_writes_load_reads_back_equal(config: RoutingConfig) -> None:
    text = dump(config)
    again = load(text)
    assert again.hosts == config.hosts
    assert again.subscriptions.keys() == config.subscriptions.keys()
    for name, decl in config.subscriptions.items():
        back = again.subscriptions[name]
        assert back.same_filter(decl)
        assert (back.service, back.host, back.kind, back.ordered, back.priority) == (
            decl.service,
            decl.host,
            decl.kind,
            decl.ordered,
            decl.priority,
        )
        assert (back.on_failure, back.correlation, back.state, back.on_expiry) == (
            decl.on_failure,
            decl.correlation,
            decl.state,
            decl.on_expiry,
        )
    assert dump(again) == text
    jsonschema.validate(_toml_as_json(text), json_schema())


def _toml_as_json(text: str) -> object:
    import tomllib

    return json.loads(json.dumps(tomllib.loads(text)))


def test_the_published_schema_is_current() -> None:
    published = json.loads((ROOT / "docs" / "routing.schema.json").read_text())
    assert published == json_schema(), "run: messagebox export --schema > docs/routing.schema.json"


def test_a_filter_reads_as_written() -> None:
    text = dump(
        load('[hosts.h]\n[[subscriptions]]\nservice = "s"\nhost = "h"\nfilter = \'a.b == "x"\'\n')
    )
    assert "filter = 'a.b == \"x\"'" in text


ONE = '[hosts.a]\n[[subscriptions]]\nservice = "s"\nhost = "a"\nfilter = "a.b == 1"\n'


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[hostz.a]\n", "f.toml:1: hostz: unknown key 'hostz'"),
        ("[hosts.a]\nthreads = 3\n", "f.toml:2: hosts.a.threads: unknown key 'threads'"),
        ('[hosts."a.b"]\nthreads = 3\n', "f.toml:2: hosts.a.b.threads: unknown key"),
        (
            ONE + 'kind = "x"\n',
            "f.toml:6: subscriptions[0].kind: Input should be 'activation' or 'instance'",
        ),
        (
            ONE + "priority = 5000\n",
            "f.toml:6: subscriptions[0].priority",
        ),
        (
            ONE + 'on_expiry = "keep"\n',
            "f.toml:6: subscriptions[0].on_expiry: Input should be 'suspend' or 'drop'",
        ),
        (
            "[hosts.a]\nmessage_ttl_seconds = -1\n",
            "f.toml:2: hosts.a.message_ttl_seconds: Input should be greater than or equal to 0.01",
        ),
        (
            ONE + 'kind = "instance"\n',
            "f.toml:2: subscriptions[0]: subscription 0 of 's': an instance subscription needs",
        ),
        (
            '[hosts.a]\n[[subscriptions]]\nservice = ""\nhost = "a"\nfilter = "a.b == 1"\n',
            "f.toml:3: subscriptions[0].service: service name '' must be a non-empty str",
        ),
    ],
)
def test_bad_files_name_file_line_and_key(text: str, said: str) -> None:
    with pytest.raises(RoutingFileError) as caught:
        load(text, "f.toml")
    assert said in str(caught.value)


def test_an_error_after_a_multi_line_filter_names_its_own_line() -> None:
    text = (
        '[hosts.a]\n[[subscriptions]]\nservice = "s"\nhost = "a"\nfilter = """\n'
        'a.b in\n  ["EU", "UK"]\n[[not a table]]\n"""\npriority = 5000\n'
        '[[subscriptions]]\nservice = "t"\nhost = "a"\nfilter = "a.b == 1"\nkind = "x"\n'
    )
    with pytest.raises(RoutingFileError, match=r"f.toml:10: subscriptions\[0\].priority"):
        load(text, "f.toml")
    with pytest.raises(RoutingFileError, match=r"f.toml:15: subscriptions\[1\].kind"):
        load(text.replace("priority = 5000", "priority = 5"), "f.toml")


def test_on_expiry_and_a_host_ttl_are_written_only_when_not_the_default() -> None:
    config = load(
        '[hosts.a]\nmessage_ttl_seconds = 3600\n[[subscriptions]]\nservice = "s"\n'
        'host = "a"\nfilter = "a.b == 1"\non_expiry = "drop"\n'
        '[[subscriptions]]\nservice = "t"\nhost = "a"\nfilter = "a.b == 2"\n'
    )
    assert config.hosts["a"].message_ttl_seconds == 3600
    assert [d.on_expiry for d in config.subscriptions.values()] == [OnExpiry.DROP, OnExpiry.SUSPEND]
    text = dump(config)
    assert text.count("on_expiry") == 1
    assert "on_expiry = 'drop'" in text
    assert "message_ttl_seconds = 3600" in text
