"""Spark routing of every column type, of nulls and absent properties, and bad input.

Each case routes a small frame and compares it with the reference evaluator on the same
values, so the expectations are never written by hand twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest

from messagebox.errors import ValidationError
from messagebox.pipelines.spark import route_dataframe
from messagebox.predicates import Filter, P, normalize_properties


def routed(
    spark: Any, rows: Sequence[tuple[Any, ...]], schema: str, subs: Mapping[str, Any], **kw: Any
) -> set[tuple[Any, int]]:
    df = spark.createDataFrame(list(rows), schema)
    return {(r["key"], r["subscription"]) for r in route_dataframe(df, subs, **kw).collect()}


def expected(
    rows: Sequence[tuple[Any, ...]], names: Sequence[str], subs: Mapping[str, Any]
) -> set[tuple[Any, int]]:
    filters = [Filter.of(e) for e in subs.values()]
    out = set()
    for row in rows:
        props = normalize_properties(
            {n: v for n, v in zip(names, row[1:], strict=True) if v is not None}
        )
        out |= {(row[0], j + 1) for j, f in enumerate(filters) if f.matches(props)}
    return out


def check(
    spark: Any, rows: Sequence[tuple[Any, ...]], columns: Mapping[str, str], subs: Mapping[str, Any]
) -> set[tuple[Any, int]]:
    schema = "key INT, " + ", ".join(f"`{n}` {t}" for n, t in columns.items())
    got = routed(spark, rows, schema, subs)
    assert got == expected(rows, list(columns), subs)
    return got


BIG = 2**53


def test_numbers_compare_exactly_across_int_and_float_columns(spark: Any) -> None:
    ints = [BIG, BIG + 1, 2**63 - 1, -(2**63), 5, -1, 0]
    floats = [float(BIG), float(BIG), 9.223372036854776e18, -9.223372036854776e18, 5.0, -0.0, 0.5]
    rows = [(i, v, f) for i, (v, f) in enumerate(zip(ints, floats, strict=True))]
    subs = {
        "int==2**53": P("n.i") == BIG,
        "int==2**53+1": P("n.i") == BIG + 1,
        "int==float(2**53)": P("n.i") == float(BIG),
        "int>float(2**53)": P("n.i") > float(BIG),
        "int>=max": P("n.i") >= 2**63 - 1,
        "int<float(2**63)": P("n.i") < float(2**63),
        "int==float(2**63)": P("n.i") == float(2**63),
        "int<=min": P("n.i") <= -(2**63),
        "float==2**53+1": P("n.f") == BIG + 1,
        "float<2**53+1": P("n.f") < BIG + 1,
        "float==0": P("n.f") == 0,
        "float!=5": P("n.f") != 5,
        "in": P("n.i").in_([5.0, BIG + 1]),
        "mask": P("n.i").bitwise_and(1),
        "float mask": P("n.f").bitwise_and(1),
    }
    got = check(spark, rows, {"n.i": "BIGINT", "n.f": "DOUBLE"}, subs)
    assert (1, 2) in got  # 2**53 + 1 is not 2.0**53
    assert (0, 2) not in got


def test_small_integer_and_float32_columns(spark: Any) -> None:
    rows = [(0, 1, 2, 3, 0.5), (1, -128, -32768, -(2**31), 3.4e38), (2, None, None, None, None)]
    subs = {
        "b": P("n.b") == 1,
        "s": P("n.s") < 0,
        "i": P("n.i") >= 3,
        "f": P("n.f") == 0.5,
        "f big": P("n.f") > 3e38,
        "none": P("n.b").not_exists() & P("n.f").not_exists(),
    }
    check(spark, rows, {"n.b": "TINYINT", "n.s": "SMALLINT", "n.i": "INT", "n.f": "FLOAT"}, subs)


def test_decimals_are_ints_when_integral(spark: Any) -> None:
    rows = [
        (0, Decimal("2.00"), Decimal(7)),
        (1, Decimal("2.50"), Decimal(2**62)),
        (2, Decimal("-3.25"), None),
    ]
    subs = {
        "two": P("d.x") == 2,
        "mask": P("d.x").bitwise_and(2),
        "half": P("d.x") == 2.5,
        "neg": P("d.x") < -3,
        "int mask": P("d.i").bitwise_and(1),
        "big": P("d.i") == 2**62,
    }
    got = check(spark, rows, {"d.x": "DECIMAL(10,2)", "d.i": "DECIMAL(20,0)"}, subs)
    assert (0, 2) in got  # Decimal 2.00 is the int 2: bitwise_and applies


def test_families_never_meet(spark: Any) -> None:
    rows = [(0, True, "1", 1), (1, False, "0", 0), (2, None, "true", None)]
    subs = {
        "bool==1": P("f.b") == 1,
        "bool==True": P("f.b") == True,  # noqa: E712
        "bool!=1": P("f.b") != 1,
        "str==1": P("f.s") == 1,
        "str=='1'": P("f.s") == "1",
        "int==True": P("f.i") == True,  # noqa: E712
        "int in": P("f.i").in_([True, "1", 1.0]),
        "bool mask": P("f.b").bitwise_and(1),
        "str>": P("f.s") > 0,
    }
    got = check(spark, rows, {"f.b": "BOOLEAN", "f.s": "STRING", "f.i": "BIGINT"}, subs)
    assert got == {(0, 2), (0, 5), (0, 7)}  # bool != 1 holds for no bool


def test_strings_compare_by_code_point(spark: Any) -> None:
    values = ["", "a", "é", "z", "\uffff", "😀", "e\u0301", "ab"]
    rows = [(i, v) for i, v in enumerate(values)]
    subs = {
        "gt ffff": P("s.v") > "\uffff",
        "lt emoji": P("s.v") < "😀",
        "ge é": P("s.v") >= "é",
        "prefix e": P("s.v").prefix("e"),
        "prefix empty": P("s.v").prefix(""),
        "prefix ab": P("s.v").prefix("ab"),
        "prefix emoji": P("s.v").prefix("😀"),
        "eq empty": P("s.v") == "",
    }
    got = check(spark, rows, {"s.v": "STRING"}, subs)
    assert (5, 1) in got  # U+1F600 sorts after U+FFFF by code point (not in UTF-16)


def test_absent_and_null_properties_satisfy_only_not_exists(spark: Any) -> None:
    rows = [(0, None, None), (1, "x", None), (2, None, 3)]
    subs = {
        "ne": P("a.s") != "y",
        "lt": P("a.n") < 10,
        "exists": P("a.s").exists(),
        "not exists": P("a.s").not_exists(),
        "both absent": P("a.s").not_exists() & P("a.n").not_exists(),
        "or": P("a.s").not_exists() | (P("a.n") == 3),
        "untested": P("a.other").not_exists(),
    }
    got = check(spark, rows, {"a.s": "STRING", "a.n": "BIGINT"}, subs)
    assert (0, 5) in got
    assert (0, 1) not in got


def test_long_rows_with_no_value_are_absent(spark: Any) -> None:
    rows = [(1, "a.s", None, None), (1, "a.n", None, 4), (2, "a.s", "x", None)]
    schema = "key INT, property STRING, value_str STRING, value_int BIGINT"
    subs = {"s absent": P("a.s").not_exists(), "n": P("a.n") == 4, "s": P("a.s") == "x"}
    assert routed(spark, rows, schema, subs) == {(1, 1), (1, 2), (2, 3)}


def test_subscriptions_with_several_groups_route_once(spark: Any) -> None:
    rows = [(0, "EU", 5), (1, "US", 5)]
    subs = {"either": (P("g.r") == "EU") | (P("g.n") == 5) | P("g.n").exists()}
    got = routed(spark, rows, "key INT, `g.r` STRING, `g.n` BIGINT", subs)
    assert got == {(0, 1), (1, 1)}


def test_renamed_and_picked_property_columns(spark: Any) -> None:
    df = spark.createDataFrame([(1, "EU", "ignored text")], "id INT, region STRING, note STRING")
    routes = route_dataframe(
        df, {"eu": P("orders.Region") == "EU"}, key="id", properties={"region": "orders.Region"}
    )
    assert [tuple(r) for r in routes.collect()] == [(1, 1, "eu", "eu", None)]


def test_no_subscriptions_routes_nothing(spark: Any) -> None:
    df = spark.createDataFrame([(1, "EU")], "key INT, `o.r` STRING")
    routes = route_dataframe(df, {})
    assert routes.columns == ["key", "subscription", "name", "service", "host"]
    assert routes.count() == 0


# --- bad input ---


@pytest.mark.parametrize(
    ("ddl", "value", "says"),
    [
        ("ARRAY<INT>", [1], "array<int>"),
        ("MAP<STRING,INT>", {"a": 1}, "map<string,int>"),
        ("STRUCT<a: INT>", (1,), "struct<a:int>"),
        ("BINARY", b"x", "binary"),
        ("DATE", date(2024, 1, 1), "cast it to timestamp"),
        ("TIMESTAMP_NTZ", datetime(2024, 1, 1), "timestamp_ntz has no time zone"),
    ],
)
def test_unsupported_column_types_are_refused_by_name(
    spark: Any, ddl: str, value: Any, says: str
) -> None:
    df = spark.createDataFrame([(1, value)], f"key INT, `o.x` {ddl}")
    with pytest.raises(ValidationError, match=f"column 'o.x' has type .*{says}"):
        route_dataframe(df, {"s": P("o.x").exists()})


def test_a_column_that_is_no_property_name_is_refused(spark: Any) -> None:
    df = spark.createDataFrame([(1, 2.0)], "key INT, `total amount` DOUBLE")
    with pytest.raises(ValidationError, match=r"column 'total amount'.*namespace\.Name"):
        route_dataframe(df, {"s": P("o.x").exists()})


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"properties": ["o.missing"]}, "no column 'o.missing'"),
        ({"key": "id"}, "no key column 'id'"),
        ({"properties": {"a": "o.x", "b": "O.x"}}, None),
        ({"properties": {"a": "o.x", "b": "o.x"}}, "columns 'a' and 'b' are both property o.x"),
        ({"layout": "tall"}, "layout must be"),
    ],
)
def test_bad_arguments_name_the_culprit(
    spark: Any, kwargs: dict[str, Any], says: str | None
) -> None:
    df = spark.createDataFrame([(1, 1, 2)], "key INT, a INT, b INT")
    if says is None:  # names are case-sensitive: two distinct properties
        route_dataframe(df, {"s": P("o.x").exists()}, **kwargs)
        return
    with pytest.raises(ValidationError, match=says):
        route_dataframe(df, {"s": P("o.x").exists()}, **kwargs)


@pytest.mark.parametrize(
    ("rows", "schema", "says"),
    [
        (
            [(1, float("nan"))],
            "key INT, `o.x` DOUBLE",
            r"property 'o.x': float is not finite \(message key 1\)",
        ),
        ([(1, float("inf"))], "key INT, `o.x` DOUBLE", "float is not finite"),
        ([(None, 1.0)], "key INT, `o.x` DOUBLE", "key column 'key' is null"),
        (
            [(7, "x" * 257)],
            "key INT, `o.x` STRING",
            r"longer than 256 characters \(message key 7\)",
        ),
        ([(7, "a\x00b")], "key INT, `o.x` STRING", "NUL"),
        (
            [(3, "bad name", "v")],
            "key INT, property STRING, value STRING",
            "property name 'bad name'",
        ),
        (
            [(3, None, "v")],
            "key INT, property STRING, value STRING",
            "property column 'property' is null",
        ),
        (
            [(3, "o.x", "v", 1)],
            "key INT, property STRING, value_s STRING, value_i INT",
            "more than one",
        ),
        ([(4, Decimal(2**64))], "key INT, `o.x` DECIMAL(30,0)", "does not fit in 64 bits"),
    ],
)
def test_bad_values_fail_the_job_naming_column_and_key(
    spark: Any, rows: list[Any], schema: str, says: str
) -> None:
    df = spark.createDataFrame(rows, schema)
    subs = {"s": P("o.x").exists()}
    with pytest.raises(Exception, match=says):  # a Spark error, raised by the job
        route_dataframe(df, subs, validate=False).collect()


def test_duplicate_keys_are_refused_before_routing(spark: Any) -> None:
    wide = spark.createDataFrame([(1, "a"), (1, "b")], "key INT, `o.x` STRING")
    with pytest.raises(ValidationError, match="message key 1 appears 2 times"):
        route_dataframe(wide, {"s": P("o.x").exists()})
    long = spark.createDataFrame(
        [(1, "o.x", "a"), (1, "BTS.y", "b"), (1, "messagebox.y", "c")],
        "key INT, property STRING, value STRING",
    )
    with pytest.raises(
        ValidationError, match=r"message key 1, 'messagebox\.y' gives property 2 times"
    ):
        route_dataframe(long, {"s": P("o.x").exists()})


def test_a_long_property_column_must_hold_strings(spark: Any) -> None:
    df = spark.createDataFrame([(1, 5, "v")], "key INT, property INT, value STRING")
    with pytest.raises(ValidationError, match="property column 'property' has type int"):
        route_dataframe(df, {"s": P("o.x").exists()})


def test_timestamps_are_instants(spark: Any) -> None:
    at = datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    rows = [(0, at), (1, datetime(9999, 12, 31, tzinfo=UTC))]
    subs = {"before epoch": P("t.x") < datetime(1970, 1, 1, tzinfo=UTC), "eq": P("t.x") == at}
    assert check(spark, rows, {"t.x": "TIMESTAMP"}, subs) == {(0, 1), (0, 2)}


@pytest.mark.parametrize("key", ["p", "sub", "_k", "order.id"])
def test_any_key_column_name_works(spark: Any, key: str) -> None:
    df = spark.createDataFrame([(1, "EU")], f"`{key}` INT, region STRING")
    routes = route_dataframe(
        df, {"eu": P("o.Region") == "EU"}, key=key, properties={"region": "o.Region"}
    )
    assert routes.columns[0] == key
    assert [tuple(r) for r in routes.collect()] == [(1, 1, "eu", "eu", None)]


def test_a_key_named_like_an_output_column_is_refused(spark: Any) -> None:
    df = spark.createDataFrame([(1, "EU")], "subscription INT, `o.Region` STRING")
    with pytest.raises(ValidationError, match="may not be called 'subscription'"):
        route_dataframe(df, {"eu": P("o.Region") == "EU"}, key="subscription")
