-- DuckDB: the batch is an Arrow table registered on the publishing connection.

-- name: staged --
staged AS (SELECT * FROM mb_arrow_rows),
batch AS (SELECT CAST(range AS INTEGER) AS msg FROM range(CAST($n AS BIGINT)))

-- name: claim_set --
-- What every claim sets on the rows it leases (see lease). A lease that lapsed with no
-- outcome (lease_owner still set) makes this delivery an interrupted one, and charges an
-- attempt if that delivery had been marked started (its host ended during it).
SET lease_owner = $owner,
    lease_expires = now() + to_microseconds(CAST($lease_us AS BIGINT)),
    attempts = attempts + 1,
    claimed_at = coalesce(claimed_at, now()),
    charges = charges + CASE WHEN lease_owner IS NOT NULL AND started_by IS NOT NULL
                             THEN 1 ELSE 0 END,
    crashed_by = CASE WHEN lease_owner IS NOT NULL AND started_by IS NOT NULL
                      THEN started_by ELSE crashed_by END,
    interrupted = lease_owner IS NOT NULL,
    started_by = NULL

-- name: claim_values --
-- What a claim returns of each entry it picks: its values once claim_set has leased it
-- (now() is the transaction's: the same in the lease that follows). A claim here is
-- two statements, this SELECT and the lease (an UPDATE by id): DuckDB's UPDATE ...
-- RETURNING took 25 ms for 800 rows, against 3 without RETURNING. The message id comes
-- as its 16 bytes (ids.as_uuid): DuckDB makes each UUID it returns through
-- uuid.UUID's checks, 1-2 us a value more.
SELECT id, CAST(msg AS BLOB), sub, attempts + 1, priority, instance_id, ordered,
       epoch_us(enqueued_at), epoch_us(coalesce(claimed_at, now())), epoch_us(now()),
       charges + CASE WHEN lease_owner IS NOT NULL AND started_by IS NOT NULL
                      THEN 1 ELSE 0 END,
       lease_owner IS NOT NULL,
       CASE WHEN lease_owner IS NOT NULL AND started_by IS NOT NULL
            THEN started_by ELSE crashed_by END

-- name: lease --
-- Lease the entries a claim picked (claims are serialised in-process: DuckDB has no row
-- locks; see dialects/duckdb.py).
UPDATE mb_queue
-- include: claim_set
WHERE id IN (SELECT unnest(CAST($ids AS BIGINT[])))

-- name: plain_ready --
-- A host's plain entries that a claim may take now (claim, claim_mixed): due, and not
-- expired (the expiry sweep takes those: expiry.py).
WHERE host = $host AND state = 'ready' AND NOT ordered AND instance_id IS NULL
  AND order_key IS NULL
  AND available_at <= now()
  AND (expires_at IS NULL OR expires_at > now())
  AND (lease_expires IS NULL OR lease_expires < now())

-- name: claim --
-- The next plain entries of a host, by priority and age.
-- include: claim_values
FROM mb_queue
-- include: plain_ready
ORDER BY priority DESC, id
LIMIT $n

-- name: claim_mixed --
-- claim and claim_instance (see postgresql.sql) in one statement, since each DuckDB
-- statement costs milliseconds whatever its row count. A service instance handles one
-- message at a time, in publish order: only the oldest entry of each instance is
-- claimable, while none of its entries is leased and none is suspended (resumable),
-- unless it is an ordered subscription's (taken with its run: claim_ordered).
-- The first few of those heads and of the other ready entries, each by priority and
-- age, are interleaved one of each kind at a time ($first_kind first: 1 for instance
-- heads), so neither kind takes more than half the batch while the other waits. The
-- heads come from one pass over the host's instance entries (each one's oldest row by
-- arg_min, its latest lease by max): a CTE and a join back took 0.7 ms more a claim.
-- An entry not yet due that was never delivered (scheduled) is not yet the instance's,
-- nor one expired and not in hand (the expiry sweep takes it): neither holds the
-- instance's other messages. A suspended entry holds them unless it expired.
-- include: claim_values
FROM mb_queue
WHERE id IN (
    SELECT id FROM (
        SELECT id, 1 AS kind, row_number() OVER (ORDER BY priority DESC, id) AS rn
        FROM (
            SELECT h.id, h.priority
            FROM (
                SELECT instance_id, min(id) AS id, arg_min(priority, id) AS priority,
                       arg_min(state, id) AS state, arg_min(available_at, id) AS available_at,
                       arg_min(ordered, id) AS ordered, max(lease_expires) AS last_lease
                FROM mb_queue
                WHERE host = $host AND instance_id IS NOT NULL
                  AND NOT (attempts = 0 AND available_at > now())
                  AND (expires_at IS NULL OR expires_at > now() OR lease_expires >= now())
                GROUP BY instance_id
            ) h
            WHERE (h.last_lease IS NULL OR h.last_lease < now())
              AND h.state = 'ready' AND h.available_at <= now()
              AND NOT h.ordered  -- an ordered subscription's entry goes with its run
              AND NOT EXISTS (
                  SELECT 1 FROM mb_suspended s
                  WHERE s.instance_id = h.instance_id AND s.resumable
                    AND s.reason <> 'expired'
              )
            ORDER BY h.priority DESC, h.id
            LIMIT $n
        )
        UNION ALL
        SELECT id, 0 AS kind, row_number() OVER (ORDER BY priority DESC, id) AS rn
        FROM (
            SELECT id, priority
            FROM mb_queue
-- include: plain_ready
            ORDER BY priority DESC, id
            LIMIT $n
        )
    )
    ORDER BY rn, CASE WHEN kind = $first_kind THEN 0 ELSE 1 END
    LIMIT $n
)

-- name: ordered_heads --
-- The ordered subscriptions' heads (claim_ordered, blocked_heads): a subscription's head
-- is its oldest entry that no suspended step holds, so that one whose every entry is
-- held leaves the others their turn; busy while one of its entries is leased. An
-- expired entry is passed over (the expiry sweep takes it); one not due yet is a head
-- like any other, and holds the later ones (`wall`: the run ends before it). (Guarded
-- NOT INs: an anti-join on every row cost half a millisecond a claim.)
held AS (
    SELECT s.instance_id FROM mb_suspended s
    WHERE s.resumable AND s.instance_id IS NOT NULL AND s.reason <> 'expired'
),
heads AS (
    SELECT sub,
           min(id) FILTER (WHERE (instance_id IS NULL
                                  OR instance_id NOT IN (SELECT instance_id FROM held))
                             AND (expires_at IS NULL OR expires_at > now())) AS id,
           min(id) FILTER (WHERE available_at > now()
                             AND (instance_id IS NULL
                                  OR instance_id NOT IN (SELECT instance_id FROM held))
                             AND (expires_at IS NULL OR expires_at > now())) AS wall,
           max(CASE WHEN lease_expires >= now() THEN 1 ELSE 0 END) AS busy
    FROM mb_queue WHERE host = $host AND ordered GROUP BY sub
)

-- name: claim_ordered --
-- An ordered subscription is served by one claimer at a time: the run of its oldest
-- entries, taken only when its head is free. Its claimer handles the run in id order
-- (strictly publish order, one at a time) and gives back the rest on a failure. An
-- entry of a service instance (a correlated subscription) obeys its instance too: it
-- is passed over while a suspended (resumable) step holds the instance's later
-- messages, and the run ends before one whose instance is busy elsewhere (run_cut;
-- a subscription whose head that leaves waiting is skipped, `skip`, for the next:
-- blocked_heads).
-- include: claim_values
FROM mb_queue
WHERE id IN (
    WITH
-- include: ordered_heads
    ,
    free AS (
        SELECT h.sub, h.wall
        FROM heads h
        JOIN mb_queue q ON q.id = h.id
        WHERE h.busy = 0 AND q.state = 'ready' AND q.available_at <= now()
          AND h.sub NOT IN (SELECT unnest(CAST($skip AS BIGINT[])))  -- runs cut empty
        ORDER BY q.priority DESC, q.id
        LIMIT 1
    )
    SELECT q.id
    FROM mb_queue q
    JOIN free f ON q.sub = f.sub
    WHERE q.state = 'ready' AND q.available_at <= now()
      AND (f.wall IS NULL OR q.id < f.wall)  -- a scheduled entry holds the later ones
      AND (q.expires_at IS NULL OR q.expires_at > now())
      AND (q.lease_expires IS NULL OR q.lease_expires < now())
      AND (q.instance_id IS NULL OR q.instance_id NOT IN (SELECT instance_id FROM held))
    ORDER BY q.id
    LIMIT $n
)

-- name: keyed_pick --
-- The keyed entries of a host to claim (subscriptions ordered by a property; see
-- mb_claim_keyed in postgresql.sql): the runs of free keys, up to $n entries, oldest
-- first (each key's a prefix of its run: the caller keeps at most a run's length of it,
-- see DuckDBDialect.lease_keyed). A key is free when none of its entries is leased and
-- no suspended entry holds it; its head is its oldest entry not expired (an expired one
-- not in hand is passed over: the expiry sweep takes it), and its run ends before its
-- first entry not claimable now (a retry or a scheduled entry holds the later ones:
-- `wall`). The keys come from one pass over the host's keyed entries (grouped), their
-- runs from a join back: with a row number per key (a window over every entry of the
-- keys taken), a claim of 400 took 10 ms against 6.
WITH keys AS (
    SELECT sub, order_key,
           max(CASE WHEN lease_expires >= now() THEN 1 ELSE 0 END) AS busy,
           min(id) FILTER (WHERE expires_at IS NULL OR expires_at > now()) AS head,
           min(id) FILTER (WHERE (expires_at IS NULL OR expires_at > now())
                             AND (state <> 'ready' OR available_at > now())) AS wall,
           arg_min(priority, id) AS priority
    FROM mb_queue WHERE host = $host AND order_key IS NOT NULL
    GROUP BY sub, order_key
),
free AS (
    SELECT k.sub, k.order_key, k.wall
    FROM keys k
    WHERE k.busy = 0 AND k.head IS NOT NULL AND (k.wall IS NULL OR k.wall > k.head)
      AND NOT EXISTS (
          SELECT 1 FROM mb_suspended s
          WHERE s.holds_key AND s.sub = k.sub AND s.order_key = k.order_key
      )
    ORDER BY k.priority DESC, k.head
    LIMIT $n
)
SELECT e.id
FROM mb_queue e
JOIN free f ON e.sub = f.sub AND e.order_key = f.order_key
WHERE e.host = $host AND (f.wall IS NULL OR e.id < f.wall)
  AND (e.expires_at IS NULL OR e.expires_at > now())
ORDER BY e.priority DESC, e.id
LIMIT $n

-- name: claim_keyed --
-- include: claim_values
     , order_key
FROM mb_queue
WHERE id IN (
-- include: keyed_pick
)

-- name: claim_keyed_plain --
-- claim_keyed and claim in one statement (each DuckDB statement costs milliseconds
-- whatever its row count): up to $n keyed entries and $plain plain ones; the caller
-- keeps its share of each (DuckDBDialect.lease_keyed). A host with a subscription
-- ordered by a property beside plain ones claimed 18% slower with two.
-- include: claim_values
     , order_key
FROM mb_queue
WHERE id IN (
    SELECT id FROM (
-- include: keyed_pick
    )
    UNION ALL
    SELECT id FROM (
        SELECT id
        FROM mb_queue
-- include: plain_ready
        ORDER BY priority DESC, id
        LIMIT $plain
    )
)

-- name: run_cut --
-- Where an ordered run of service instances' entries must end (see mb_ordered_run in
-- postgresql.sql): its first entry whose instance has an older entry of another
-- subscription, or one leased. Run only for a run that holds such entries: the same
-- test inside claim_ordered made every ordered claim 2.5 times as long.
SELECT min(r.id)
FROM (SELECT unnest(CAST($ids AS BIGINT[])) AS id,
             unnest(CAST($instances AS TEXT[])) AS instance_id) r
WHERE EXISTS (
    SELECT 1 FROM mb_queue o
    WHERE o.host = $host AND o.instance_id = r.instance_id AND o.sub <> $sub
      AND (o.id < r.id OR o.lease_expires >= now())
)

-- name: blocked_heads --
-- The ordered subscriptions whose head waits for its instance, as run_cut tests it: a
-- claim whose run the cut left empty picks again without them (one statement, however
-- many there are).
WITH
-- include: ordered_heads
SELECT h.sub
FROM heads h
JOIN mb_queue q ON q.id = h.id
WHERE q.instance_id IS NOT NULL AND EXISTS (
    SELECT 1 FROM mb_queue o
    WHERE o.host = $host AND o.instance_id = q.instance_id AND o.sub <> q.sub
      AND (o.id < q.id OR o.lease_expires >= now())
)

-- name: read_messages --
-- The messages of a read of many (spool.read_messages): a row per part, in message and
-- part order. A part's bytes come where each part of its message is within the message's
-- share of the read's limits ($share; NULL: no limit), so that the read never brings
-- more than they allow; its id where they do not, or where it has further fragments (read
-- after). Which messages come whole is decided in Python: window functions for it took
-- 2.4-4 ms of a read of 200 messages. Ids come as their 16 bytes (see claim_values).
SELECT CAST(s.id AS BLOB), s.context, s.body_part, epoch_us(s.published_at), s.publisher, mp.name,
       CASE WHEN p.n_fragments > 1
                 OR NOT (CAST($share AS BIGINT) IS NULL OR p.size * s.n_parts <= $share)
            THEN CAST(p.id AS BLOB) END,
       p.size, p.n_fragments,
       CASE WHEN CAST($share AS BIGINT) IS NULL OR p.size * s.n_parts <= $share
            THEN p.data END
FROM mb_spool s
LEFT JOIN mb_message_part mp ON mp.msg = s.id
LEFT JOIN mb_part p ON p.id = mp.part
WHERE s.id IN (SELECT CAST(id AS UUID) FROM mb_arrow_rows)  -- the ids, an Arrow table
ORDER BY s.id, mp.idx

-- name: load_instances --
-- The saved service instances among $ids, and those of the missing ones that routing
-- made the running instance of a convoy (their first step has not committed), in one
-- statement (service_instances.load). The completion time as microseconds since the
-- epoch: a time with a zone costs about 3 us a value to fetch here.
SELECT id, service, host, state, correlation, data, version, epoch_us(completed_at),
       false AS convoy
FROM mb_service_instance
WHERE id IN (SELECT unnest(CAST($ids AS TEXT[])))
UNION ALL
SELECT instance_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, true
FROM mb_convoy
WHERE instance_id IN (SELECT unnest(CAST($ids AS TEXT[])))

-- name: find_convoys --
-- The running instance of each (service, key) of a publish that has one (convoys.py):
-- the pairs zipped from two lists. As SQLAlchemy's IN lists, compiled per batch, this
-- and create_convoys took 62% of publishing 500 messages that start instances.
SELECT c.service, c.key, c.instance_id
FROM mb_convoy c
WHERE (c.service, c.key) IN (
    SELECT unnest(CAST($services AS TEXT[])), unnest(CAST($keys AS TEXT[])))

-- name: create_convoys --
-- Make the missing convoys of a publish (convoys.py), each with its new instance id, unless
-- one is there by now: the caller counts the rows made (a concurrent transaction's
-- commit of the same key fails this one's insert or commit on DuckDB: Conflict).
INSERT INTO mb_convoy (service, key, instance_id, created_at)
SELECT unnest(CAST($services AS TEXT[])), unnest(CAST($keys AS TEXT[])),
       unnest(CAST($ids AS TEXT[])), CAST($now AS TIMESTAMPTZ)
ON CONFLICT DO NOTHING
