-- PostgreSQL: the batch arrives as arrays, unnested in the statement itself.

-- name: staged --
staged AS (
    SELECT *
    FROM unnest(
        %(msg)s::integer[], %(name)s::text[], %(fam)s::smallint[], %(v_str)s::text[],
        %(hi)s::float8[], %(lo)s::float8[], %(v_int)s::bigint[]
    ) AS t(msg, name, fam, v_str, hi, lo, v_int)
),
batch AS (SELECT generate_series(0, %(n)s - 1) AS msg)

-- name: lock_subscriptions --
-- Serialise subscription changes (shared predicates are created and collected safely).
SELECT pg_advisory_xact_lock(7240115001)

-- name: lock_schema --
SELECT pg_advisory_xact_lock(7240115000)
