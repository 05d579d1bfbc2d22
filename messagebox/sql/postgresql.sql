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

-- name: publish_prelude --
-- What a publish reads before it routes, in one round trip: the routing fence, shared
-- (messagebox/fence.py), then the transaction's time, a block of ids, and the routing
-- versions after the one this process's index holds.
SELECT * FROM mb_publish_prelude(%(v)s)

-- name: publish_prelude_function --
-- PL/pgSQL, VOLATILE: its query takes a snapshot of its own after the lock is granted,
-- so a publish that waited for a subscription change reads the versions it committed
-- (one statement taking the lock and reading would read them as they were before).
-- It also says which store the connection sees and the transaction's isolation, for a
-- publish that joins a transaction its caller owns (publish(connection=)).
DROP FUNCTION IF EXISTS mb_publish_prelude(bigint);
CREATE FUNCTION mb_publish_prelude(p_v bigint)
RETURNS TABLE (at timestamptz, block bigint, versions bigint[], subs bigint[], store text,
               isolation text)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(724013, hashtext(current_schema()));
    RETURN QUERY
    SELECT now(), nextval('mb_block_seq'),
           ARRAY(SELECT c.version FROM mb_routing_change c WHERE c.version > p_v
                 ORDER BY c.version, c.sub),
           ARRAY(SELECT c.sub FROM mb_routing_change c WHERE c.version > p_v
                 ORDER BY c.version, c.sub),
           (SELECT m.value FROM mb_meta m WHERE m.key = 'store_id'),
           current_setting('transaction_isolation');
END
$$

-- name: fence_changes --
-- The routing fence, exclusive: a subscription change waits for the publishes in flight.
SELECT pg_advisory_xact_lock(724013, hashtext(current_schema()))

-- name: lock_subscriptions --
-- Serialise subscription changes (shared predicates are created and collected safely).
SELECT pg_advisory_xact_lock(7240115001)

-- name: lock_schema --
SELECT pg_advisory_xact_lock(7240115000)

-- name: lock_cleanup --
-- One cleanup at a time across processes; the others skip their turn. Per schema: a
-- store in another schema of the same database cleans up on its own.
SELECT pg_try_advisory_xact_lock(724012, hashtext(current_schema()))

-- name: notify --
-- Wake idle host instances of these hosts (delivered when the transaction commits).
SELECT pg_notify('messagebox', current_schema() || '/' || h)
FROM unnest(%(hosts)s::text[]) AS h

-- name: claim_set --
-- What every claim sets on the rows it leases. A lease that lapsed with no outcome
-- (lease_owner still set) makes this delivery an interrupted one, and charges an
-- attempt if that delivery had been marked started (its host ended during it).
SET lease_owner = %(owner)s,
    lease_expires = now() + make_interval(secs => %(lease)s),
    attempts = q.attempts + 1,
    claimed_at = coalesce(q.claimed_at, now()),
    charges = q.charges + CASE WHEN q.lease_owner IS NOT NULL AND q.started_by IS NOT NULL
                               THEN 1 ELSE 0 END,
    crashed_by = CASE WHEN q.lease_owner IS NOT NULL AND q.started_by IS NOT NULL
                      THEN q.started_by ELSE q.crashed_by END,
    interrupted = q.lease_owner IS NOT NULL,
    started_by = NULL

-- name: claim_function_settings --
-- What each claim function (mb_claimable, mb_ordered_run, mb_instance_heads,
-- mb_keyed_runs) runs with:
-- PL/pgSQL, which keeps its plan for the session, and no sort or bitmap scan, so that
-- it reads the queue by an index in the index's order, stopping at its limit.
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_sort = off
ROWS 100

-- name: claimable_function --
-- The next plain entries of a host to claim, locked (SKIP LOCKED: concurrent claimers on
-- any machine take disjoint entries, without waiting), never one of `skip`. Always by
-- mb_queue_plain, in its order, stopping at `n`: a queue's statistics are stale by
-- nature (no ANALYZE has seen the backlog of a minute ago), and with an estimate of a
-- few rows the planner read every ready entry of the host and sorted them, 48 ms a
-- claim at 100,000 entries against 0.14 ms by the index. A function is the one place a
-- statement can carry its own planner settings. PL/pgSQL, not SQL: it keeps its plan
-- for the session, where a SQL function with settings is planned at every call (the
-- claim-and-complete statement ran a twentieth faster).
CREATE OR REPLACE FUNCTION mb_claimable(p_host text, p_n bigint, p_skip bigint[])
RETURNS SETOF bigint
-- include: claim_function_settings
AS $fn$
BEGIN
    RETURN QUERY
    SELECT q.id FROM mb_queue q
    WHERE q.host = p_host AND q.state = 'ready' AND NOT q.ordered AND q.instance_id IS NULL
      AND q.order_key IS NULL
      AND q.available_at <= now()
      AND (q.expires_at IS NULL OR q.expires_at > now())  -- the expiry sweep takes it
      AND (q.lease_expires IS NULL OR q.lease_expires < now())
      AND q.id <> ALL(p_skip)
    ORDER BY q.priority DESC, q.id
    LIMIT p_n
    FOR UPDATE SKIP LOCKED;
END
$fn$

-- name: ordered_run_function --
-- The run of an ordered subscription to claim: its oldest ready entries, by the ordered
-- index in id order (see mb_claimable: an unanalysed queue of 100,000 entries made it
-- read and sort them all to disk, 126 ms a claim), none while one of its entries is in
-- hand. One claimer of a subscription at a time: the subscription's advisory lock, for
-- the claim's transaction (tried, never waited for), besides the head the claim
-- locked (a head can change under a claim: a suspension resumed or ended); the rows
-- are locked by the claim's UPDATE, only those it takes. An entry of a service
-- instance (a correlated subscription) obeys its instance too: passed over while a
-- suspended (resumable) step holds the instance's later messages, and the run ends at
-- one whose instance another claim is taking (claim_instance's lock), or that has an
-- older entry of another subscription, or one leased: it waits for that, and what
-- follows it in the subscription waits for it. An expired entry is passed over (the
-- expiry sweep takes it); one not due yet (scheduled) ends the run: it holds the
-- later ones.
CREATE OR REPLACE FUNCTION mb_ordered_run(p_host text, p_sub bigint, p_n bigint)
RETURNS SETOF bigint
-- include: claim_function_settings
AS $fn$
DECLARE
    r record;
    taken bigint := 0;
BEGIN
    -- advisory locks span the database: the schema names the store's own
    IF p_n < 1 OR NOT pg_try_advisory_xact_lock(724012, hashtext(current_schema() || '/' || p_sub::text)) THEN
        RETURN;
    END IF;
    IF EXISTS (  -- by mb_queue_run_lease: the entries in hand, not the backlog
        SELECT 1 FROM mb_queue q
        WHERE q.host = p_host AND q.sub = p_sub AND q.run_lease >= now()
    ) THEN
        RETURN;
    END IF;
    FOR r IN
        SELECT q.id, q.instance_id, q.available_at, q.expires_at FROM mb_queue q
        WHERE q.host = p_host AND q.ordered AND q.sub = p_sub
          AND q.state = 'ready'
          AND (q.lease_expires IS NULL OR q.lease_expires < now())
        ORDER BY q.id
    LOOP
        CONTINUE WHEN r.expires_at <= now();
        IF r.instance_id IS NOT NULL THEN
            CONTINUE WHEN EXISTS (
                SELECT 1 FROM mb_suspended s
                WHERE s.instance_id = r.instance_id AND s.resumable
                  AND s.reason <> 'expired'
            );
        END IF;
        EXIT WHEN r.available_at > now();
        IF r.instance_id IS NOT NULL THEN
            EXIT WHEN NOT pg_try_advisory_xact_lock(724011, hashtext(r.instance_id));
            EXIT WHEN EXISTS (
                SELECT 1 FROM mb_queue o
                WHERE o.host = p_host AND o.instance_id = r.instance_id AND o.sub <> p_sub
                  AND (o.id < r.id OR o.lease_expires >= now())
            );
        END IF;
        RETURN NEXT r.id;
        taken := taken + 1;
        EXIT WHEN taken >= p_n;
    END LOOP;
END
$fn$

-- name: run_lease_column --
-- An ordered subscription's entries in hand, indexed (mb_queue_run_lease): their lease,
-- NULL for every other entry. Computed by PostgreSQL on every write, so no statement
-- that leases or releases an entry can miss it; a claim of a plain entry leaves it NULL,
-- an indexed column unchanged, and still updates the row in place (see
-- schema.QUEUE_FILLFACTOR), where an index on lease_expires would stop that for all.
ALTER TABLE mb_queue ADD COLUMN IF NOT EXISTS run_lease TIMESTAMP WITH TIME ZONE
    GENERATED ALWAYS AS (CASE WHEN ordered THEN lease_expires END) STORED

-- name: run_lease_index --
CREATE INDEX IF NOT EXISTS mb_queue_run_lease ON mb_queue (host, sub, run_lease)
    WHERE run_lease IS NOT NULL

-- name: key_last_column --
-- Set by a keyed claim on the last entry of each key's run it takes (mb_keyed_runs),
-- false on the others: the one entry of a run in hand that key_lease marks.
ALTER TABLE mb_queue ADD COLUMN IF NOT EXISTS key_last BOOLEAN NOT NULL DEFAULT false

-- name: key_lease_column --
-- Whether a key has entries in hand, indexed (mb_queue_key_lease): the lease of the last
-- entry of each keyed run in hand, NULL for every other entry. A run is handled in
-- publish order and ends whole (completed, or its rest given back with the failure
-- that stopped it, or its leases lapsing), its last entry last: while any entry of a
-- run is in hand, so is its last. Only that entry's index entries change when a run is
-- claimed (and at its heartbeats): a lease on every entry in an index (as run_lease)
-- would stop every claim of a keyed entry from updating its row in place
-- (schema.QUEUE_FILLFACTOR), 7 ms a claim of 50 against 0.1.
ALTER TABLE mb_queue ADD COLUMN IF NOT EXISTS key_lease TIMESTAMP WITH TIME ZONE
    GENERATED ALWAYS AS (CASE WHEN key_last THEN lease_expires END) STORED

-- name: key_lease_index --
CREATE INDEX IF NOT EXISTS mb_queue_key_lease ON mb_queue (host, sub, order_key, key_lease)
    WHERE key_lease IS NOT NULL

-- name: keyed_runs_function --
-- Claims the keyed entries of a host (subscriptions ordered by a property): for each
-- key that is free, its run, at most p_per_key of its oldest entries in publish order,
-- up to p_n in all, leased to p_owner for p_lease seconds, the last of each run marked
-- (key_last). Keys come in claim order (priority, then the age of their oldest ready
-- entry), by mb_queue_keyed_claim. A key is free when no entry of it is in hand
-- (key_lease: an entry with an older id can commit after a later one was claimed, or
-- be resumed), none older waits (for its retry, or scheduled: it holds the later
-- ones; an expired one not in hand is passed over: the expiry sweep takes it), and no
-- suspended entry holds it (its subscription stops on failure). One claimer of a key
-- at a time: the key's advisory lock for the claim's transaction (tried, never waited
-- for), and only then those tests, in snapshots taken after the lock, which see a
-- claim committed meanwhile. A run ends before an entry not claimable now. Each key is
-- tried once (`seen`), however many of its entries the walk passes.
-- The function leases the runs itself, in a snapshot taken after it read them: the
-- calling statement's snapshot is older, and an entry committed in between (read
-- here, not seen there) was left unleased by an UPDATE there. Were it a run's last,
-- the run was in hand without its key's lease, and another claimer took it again.
-- Where a run's last entry went meanwhile (deleted), the last entry leased of its run
-- carries the key's lease.
DROP FUNCTION IF EXISTS mb_keyed_runs(text, bigint, bigint, bigint[]);
DROP FUNCTION IF EXISTS mb_claim_keyed(text, bigint, bigint, bigint[], text, float8);
CREATE FUNCTION mb_claim_keyed(
    p_host text, p_n bigint, p_per_key bigint, p_skip bigint[], p_owner text, p_lease float8
)
RETURNS SETOF mb_queue
-- include: claim_function_settings
-- its statements planned once for the session (a key's is run for every key a claim
-- takes): the sessions' force_custom_plan planned it anew each time, 2 ms a claim of
-- 50 against 0.7
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    r record;
    k text;
    seen text[] := '{}';
    run bigint[];
    ids bigint[] := '{}';
    lasts bigint[] := '{}';
    leased bigint;
BEGIN
    IF p_n < 1 THEN
        RETURN;
    END IF;
    FOR r IN
        SELECT q.id, q.sub, q.order_key FROM mb_queue q
        WHERE q.host = p_host AND q.order_key IS NOT NULL AND q.state = 'ready'
          AND q.available_at <= now()
          AND (q.expires_at IS NULL OR q.expires_at > now())
          AND (q.lease_expires IS NULL OR q.lease_expires < now())
          AND q.id <> ALL(p_skip)
        ORDER BY q.priority DESC, q.id
    LOOP
        k := r.sub::text || '/' || r.order_key;
        CONTINUE WHEN k = ANY(seen);
        seen := seen || k;
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(724014, hashtext(current_schema() || '/' || k));
        -- its run, in one statement: its oldest entries not expired, as far as they are
        -- claimable now; none when it is not free (tests that do not depend on the
        -- rows, evaluated once, first)
        SELECT array_agg(x.id ORDER BY x.id) INTO run
        FROM (
            SELECT o.id, bool_and(o.state = 'ready' AND o.available_at <= now())
                             OVER (ORDER BY o.id) AS claimable
            FROM mb_queue o
            WHERE o.host = p_host AND o.sub = r.sub AND o.order_key = r.order_key
              AND o.id >= r.id AND (o.expires_at IS NULL OR o.expires_at > now())
            ORDER BY o.host, o.sub, o.order_key, o.id
            LIMIT least(p_per_key, p_n - cardinality(ids))
        ) x
        WHERE x.claimable
          AND NOT EXISTS (  -- a run of the key in hand
              SELECT 1 FROM mb_queue o
              WHERE o.host = p_host AND o.sub = r.sub AND o.order_key = r.order_key
                AND o.key_lease >= now() AND o.id <> ALL(p_skip)
          )
          AND NOT EXISTS (  -- an older entry still to deliver
              SELECT 1 FROM mb_queue o
              WHERE o.host = p_host AND o.sub = r.sub AND o.order_key = r.order_key
                AND o.id < r.id AND (o.expires_at IS NULL OR o.expires_at > now())
                AND o.id <> ALL(p_skip)
          )
          AND NOT EXISTS (
              SELECT 1 FROM mb_suspended h
              WHERE h.sub = r.sub AND h.order_key = r.order_key AND h.holds_key
          );
        CONTINUE WHEN run IS NULL;
        ids := ids || run;
        lasts := lasts || run[cardinality(run)];
        EXIT WHEN cardinality(ids) >= p_n;
    END LOOP;
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE mb_queue q
-- include: claim_set(owner=p_owner, lease=p_lease)
        , key_last = q.id = ANY(lasts)
    WHERE q.id = ANY(ids)
    RETURNING q.*;
    GET DIAGNOSTICS leased = ROW_COUNT;
    IF leased < cardinality(ids) THEN
        UPDATE mb_queue q SET key_last = true
        FROM (
            SELECT max(o.id) AS id FROM mb_queue o
            WHERE o.id = ANY(ids) AND o.lease_owner = p_owner
            GROUP BY o.sub, o.order_key
            HAVING NOT bool_or(o.key_last)
        ) m
        WHERE q.id = m.id;
    END IF;
END
$fn$

-- name: ordered_heads_function --
-- The heads of a host's ordered subscriptions that have none of their entries in hand
-- (see claim_ordered): a subscription's head is its oldest entry that no suspended step
-- holds (see mb_ordered_run), so that one whose every entry is held leaves the others
-- their turn. By index, a few rows a subscription whatever the backlog: the
-- subscriptions one after another by mb_queue_ordered (a skip scan), each tested for
-- an entry in hand by mb_queue_run_lease, its head the first of its entries by
-- mb_queue_ordered. An aggregate of the host's whole ordered backlog took 300 ms a
-- claim at 400,000 entries, every claim, even with nothing to take. An expired entry is
-- passed over (the expiry sweep takes it); one not due yet is a head like any other.
CREATE OR REPLACE FUNCTION mb_ordered_heads(p_host text)
RETURNS TABLE (head_sub bigint, head_id bigint)
-- include: claim_function_settings
AS $fn$
DECLARE
    s bigint;
    r record;
BEGIN
    s := -9223372036854775808;  -- below every subscription id
    LOOP
        s := (SELECT q.sub FROM mb_queue q
              WHERE q.host = p_host AND q.ordered AND q.sub > s ORDER BY q.sub, q.id LIMIT 1);
        EXIT WHEN s IS NULL;
        IF NOT EXISTS (
            SELECT 1 FROM mb_queue q
            WHERE q.host = p_host AND q.sub = s AND q.run_lease >= now()
        ) THEN
            FOR r IN
                SELECT q.id, q.instance_id, q.expires_at FROM mb_queue q
                WHERE q.host = p_host AND q.ordered AND q.sub = s
                ORDER BY q.sub, q.id
            LOOP
                CONTINUE WHEN r.expires_at <= now();
                CONTINUE WHEN r.instance_id IS NOT NULL AND EXISTS (
                    SELECT 1 FROM mb_suspended h
                    WHERE h.instance_id = r.instance_id AND h.resumable
                      AND h.reason <> 'expired'
                );
                head_sub := s;
                head_id := r.id;
                RETURN NEXT;
                EXIT;
            END LOOP;
        END IF;
    END LOOP;
END
$fn$

-- name: instance_heads_function --
-- The heads of a host's service instances to claim (see claim_instance): ready entries
-- of subscriptions that are not ordered, each its instance's oldest, with none of the
-- instance's entries leased and none suspended (resumable). Always by mb_queue_claim, in its order, stopping at `n` (see
-- mb_claimable): never analysed, a queue of 600,000 instance entries made the planner
-- test every ready entry of the host and sort them, 3.5 s a claim of 800 (16-79 ms
-- analysed). Columns named apart from the table's: PL/pgSQL would take them for its own.
-- An entry not yet due that was never delivered (scheduled) is not yet the instance's,
-- nor one expired and not in hand (the expiry sweep takes it): neither holds the
-- instance's other messages; nor does a suspended one that expired.
CREATE OR REPLACE FUNCTION mb_instance_heads(p_host text, p_n bigint)
RETURNS TABLE (head_id bigint, head_instance text, head_priority integer)
-- include: claim_function_settings
AS $fn$
BEGIN
    RETURN QUERY
    SELECT q.id, q.instance_id, q.priority
    FROM mb_queue q
    WHERE q.host = p_host AND q.state = 'ready' AND q.instance_id IS NOT NULL
      AND q.available_at <= now()
      AND (q.expires_at IS NULL OR q.expires_at > now())
      -- leased heads (the steps in flight, at the front of the queue) are passed over
      -- by the scan itself: probed for older entries, 3,200 of them made a claim of 800
      -- take 15 ms against 3
      AND (q.lease_expires IS NULL OR q.lease_expires < now())
      AND NOT EXISTS (  -- the instance's oldest entry, and none of its entries leased
          SELECT 1 FROM mb_queue o
          WHERE o.host = q.host AND o.instance_id = q.instance_id
            AND (o.lease_expires >= now()
                 OR o.id < q.id AND NOT (o.attempts = 0 AND o.available_at > now())
                    AND (o.expires_at IS NULL OR o.expires_at > now()))
      )
      AND NOT EXISTS (  -- a suspended step holds its instance's later messages
          SELECT 1 FROM mb_suspended s
          WHERE s.instance_id = q.instance_id AND s.resumable AND s.reason <> 'expired'
      )
      -- an ordered subscription's entry goes with its run (mb_ordered_run), in
      -- publish order, never as a head beside it
      AND NOT q.ordered
    ORDER BY q.priority DESC, q.id
    LIMIT p_n;
END
$fn$

-- name: claim --
WITH c AS MATERIALIZED (
    SELECT id FROM mb_claimable(%(host)s, %(n)s, '{}') AS id
)
UPDATE mb_queue q
-- include: claim_set
FROM c
WHERE q.id = c.id
RETURNING q.id, q.msg, q.sub, q.attempts, q.priority, q.instance_id, q.ordered, q.enqueued_at,
          q.claimed_at, now(), q.charges, q.interrupted, q.crashed_by

-- name: complete_claim --
-- The previous batch's completions and the next claim in one statement (one round trip
-- instead of three): delete the completed entries this owner still leases, log one
-- reference release per message, and lease the next entries as `claim` does (never
-- one being completed here, even if its lease lapsed). A row per claimed entry (flag
-- true), its wait computed here (seconds from enqueue to this first claim, else NULL),
-- then one row (flag false) with the ids completed as an array in the last column: the
-- caller holds the rest, and fewer values to load (batch 100: 40 us a claim against
-- 120). `done` is an array literal ('{1,2}'): a text parameter is dumped at once, a
-- list item by item.
WITH gone AS (
    DELETE FROM mb_queue
    WHERE id = ANY(%(done)s::bigint[]) AND lease_owner = %(owner)s
    RETURNING id, msg
),
released AS (
    INSERT INTO mb_ref_release (msg, n, logged_at)
    SELECT msg, count(*), now() FROM gone GROUP BY msg
),
-- the claim waits for the deletes (their count gates it): a claim keeps a lock on each
-- row it saw unleased that another claimed meanwhile, and deleting after it, two
-- threads each waited for a row the other held (a deadlock)
c AS MATERIALIZED (
    SELECT id FROM mb_claimable(%(host)s, %(n)s, %(done)s::bigint[]) AS id
    WHERE (SELECT count(*) FROM gone) >= 0
),
claimed AS (
    UPDATE mb_queue q
-- include: claim_set
    FROM c
    WHERE q.id = c.id
    RETURNING q.id, q.msg, q.sub, q.attempts, q.priority, q.instance_id, q.ordered,
              q.enqueued_at,
              CASE WHEN q.claimed_at = now()
                   THEN greatest(extract(epoch FROM now() - q.enqueued_at)::float8, 0)
              END AS waited,
              q.charges, q.interrupted, q.crashed_by
)
SELECT true, id, msg, sub, attempts, priority, instance_id, ordered, enqueued_at, waited,
       charges, interrupted, crashed_by, NULL::bigint[]
FROM claimed
UNION ALL
SELECT false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       coalesce(array_agg(id), '{}')
FROM gone

-- name: claim_keyed --
-- The runs of free keys of subscriptions ordered by a property (mb_claim_keyed), each
-- handled by the claiming thread in publish order, one at a time.
SELECT id, msg, sub, attempts, priority, instance_id, ordered, enqueued_at, claimed_at, now(),
       charges, interrupted, crashed_by, order_key
FROM mb_claim_keyed(%(host)s, %(n)s, %(per_key)s, '{}', %(owner)s, %(lease)s)

-- name: complete_claim_keyed --
-- complete_claim for a host with subscriptions ordered by a property: keyed runs
-- (mb_claim_keyed, at most `keyed` entries) and plain entries for the rest of `n`, in
-- one statement with the completions. The keyed claim runs after the deletes (their
-- count gates it), in snapshots of its own that see them: a key whose entries are
-- completed here is free for its next run in the same statement. Each claimed row has
-- its key after its other columns.
WITH gone AS (
    DELETE FROM mb_queue
    WHERE id = ANY(%(done)s::bigint[]) AND lease_owner = %(owner)s
    RETURNING id, msg
),
released AS (
    INSERT INTO mb_ref_release (msg, n, logged_at)
    SELECT msg, count(*), now() FROM gone GROUP BY msg
),
k AS MATERIALIZED (
    SELECT id, msg, sub, attempts, priority, instance_id, ordered, enqueued_at, claimed_at,
           charges, interrupted, crashed_by, order_key
    FROM mb_claim_keyed(%(host)s, %(keyed)s, %(per_key)s, %(done)s::bigint[], %(owner)s,
                        %(lease)s)
    WHERE (SELECT count(*) FROM gone) >= 0
),
c AS MATERIALIZED (
    SELECT id FROM mb_claimable(
        %(host)s, %(n)s - (SELECT count(*) FROM k), %(done)s::bigint[]
    ) AS id
    WHERE (SELECT count(*) FROM k) < %(n)s  -- not called when the keyed runs fill it
    -- (no more than n: what the planner is told, else it read the whole queue to join
    -- two functions' rows estimated at 100 each, 1.3 ms a claim)
    LIMIT %(n)s
),
claimed AS (
    UPDATE mb_queue q
-- include: claim_set
    FROM c
    WHERE q.id = c.id
    RETURNING q.id, q.msg, q.sub, q.attempts, q.priority, q.instance_id, q.ordered,
              q.enqueued_at, q.claimed_at, q.charges, q.interrupted, q.crashed_by,
              q.order_key
)
SELECT true, id, msg, sub, attempts, priority, instance_id, ordered, enqueued_at,
       CASE WHEN claimed_at = now()
            THEN greatest(extract(epoch FROM now() - enqueued_at)::float8, 0)
       END,
       charges, interrupted, crashed_by, order_key, NULL::bigint[]
FROM (SELECT * FROM k UNION ALL SELECT * FROM claimed) AS both_kinds
UNION ALL
SELECT false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       coalesce(array_agg(id), '{}')
FROM gone

-- name: claim_ordered --
-- An ordered subscription is served by one claimer at a time: the run of its oldest
-- entries, taken only when its head is free (a head another claimer has locked is
-- skipped, never waited for). Its claimer handles the run in id order (strictly publish
-- order, one at a time) and gives back the rest on a failure.
WITH heads AS MATERIALIZED (
    SELECT head_sub AS sub, head_id AS id FROM mb_ordered_heads(%(host)s)
),
free AS MATERIALIZED (
    SELECT q.sub
    FROM mb_queue q
    JOIN heads h ON q.id = h.id
    WHERE q.state = 'ready' AND q.available_at <= now()
      AND (q.lease_expires IS NULL OR q.lease_expires < now())
      -- nor one whose head waits for its instance (a run would end before it)
      AND (q.instance_id IS NULL OR NOT EXISTS (
          SELECT 1 FROM mb_queue o
          WHERE o.host = q.host AND o.instance_id = q.instance_id AND o.sub <> q.sub
            AND (o.id < q.id OR o.lease_expires >= now())
      ))
    ORDER BY q.priority DESC, q.id
    LIMIT 1
    FOR UPDATE OF q SKIP LOCKED
),
run AS MATERIALIZED (
    SELECT r.id FROM free f, mb_ordered_run(%(host)s, f.sub, %(n)s) AS r(id)
)
UPDATE mb_queue q
-- include: claim_set
FROM run
WHERE q.id = run.id
RETURNING q.id, q.msg, q.sub, q.attempts, q.priority, q.instance_id, q.ordered, q.enqueued_at,
          q.claimed_at, now(), q.charges, q.interrupted, q.crashed_by

-- name: claim_instance --
-- A service instance handles one message at a time, in publish order: only the oldest
-- entry of each instance is claimable, while none of its entries is leased (one that
-- committed late with an older id waits for the running step) and no entry of the
-- instance is suspended (resumable): a failed step holds the rest until resumed. The
-- head stays on the queue until its step commits. Two claims in flight
-- at once cannot both take an instance: each takes the instance's advisory lock for its
-- own short transaction (try, never wait), besides SKIP LOCKED on the head. The heads
-- come from mb_instance_heads, by index whatever the statistics say.
WITH candidates AS MATERIALIZED (
    SELECT head_id AS id, head_instance AS instance_id, head_priority AS priority
    FROM mb_instance_heads(%(host)s, %(n)s)
),
free AS MATERIALIZED (
    SELECT q.id
    FROM mb_queue q
    JOIN candidates c ON q.id = c.id
    -- on q itself, so that a row another claim leased meanwhile is re-checked
    WHERE q.state = 'ready' AND (q.lease_expires IS NULL OR q.lease_expires < now())
      AND pg_try_advisory_xact_lock(724011, hashtext(c.instance_id))
    ORDER BY c.priority DESC, c.id
    FOR UPDATE OF q SKIP LOCKED
)
UPDATE mb_queue q
-- include: claim_set
FROM free
WHERE q.id = free.id
RETURNING q.id, q.msg, q.sub, q.attempts, q.priority, q.instance_id, q.ordered, q.enqueued_at,
          q.claimed_at, now(), q.charges, q.interrupted, q.crashed_by

-- name: read_messages --
-- The messages of a read of many (spool.read_messages): a row per part, in message and
-- part order. A part's bytes come where each part of its message is within the message's
-- share of the read's limits (share; NULL: no limit), so that the read never brings more
-- than they allow; its id where they do not, or where it has further fragments (read
-- after). Which messages come whole is decided in Python, not by window functions.
SELECT s.id, s.context, s.body_part, s.published_at, s.publisher, mp.name,
       CASE WHEN p.n_fragments > 1
                 OR NOT (%(share)s::bigint IS NULL OR p.size * s.n_parts <= %(share)s::bigint)
            THEN p.id END,
       p.size, p.n_fragments,
       CASE WHEN %(share)s::bigint IS NULL OR p.size * s.n_parts <= %(share)s::bigint
            THEN p.data END
FROM mb_spool s
LEFT JOIN mb_message_part mp ON mp.msg = s.id
LEFT JOIN mb_part p ON p.id = mp.part
WHERE s.id = ANY(%(ids)s::uuid[])
ORDER BY s.id, mp.idx

-- name: load_instances --
-- The saved service instances among ids, and those of the missing ones that routing
-- made the running instance of a convoy (their first step has not committed), in one
-- statement (service_instances.load), each row with the transaction's time (read
-- there instead of in a round trip of its own: clock.seed_read).
SELECT id, service, host, state, correlation, data, version, completed_at, false, now()
FROM mb_service_instance
WHERE id = ANY(%(ids)s::text[])
UNION ALL
SELECT instance_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, true, now()
FROM mb_convoy
WHERE instance_id = ANY(%(ids)s::text[])

-- name: find_convoys --
-- The running instance of each (service, key) of a publish that has one (convoys.py):
-- the pairs zipped from two arrays, each found by the primary key. As SQLAlchemy's IN
-- lists, compiled per batch, this and create_convoys took most of publishing messages
-- that start instances.
SELECT c.service, c.key, c.instance_id
FROM unnest(%(services)s::text[], %(keys)s::text[]) AS w(service, key)
JOIN mb_convoy c ON c.service = w.service AND c.key = w.key

-- name: create_convoys --
-- Make the missing convoys of a publish (convoys.py), each with its new instance id, unless
-- one is there by now (a concurrent publish's insert of the same key makes this one wait
-- for its commit, then skip the row): the caller counts the rows made and reads the
-- others.
INSERT INTO mb_convoy (service, key, instance_id, created_at)
SELECT service, key, instance_id, %(now)s
FROM unnest(%(services)s::text[], %(keys)s::text[], %(ids)s::text[]) AS w(service, key, instance_id)
ON CONFLICT DO NOTHING
