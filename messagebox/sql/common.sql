-- Statements shared by every dialect. A dialect's own file supplies `staged` and
-- `batch` (the staged promoted properties and the batch's message numbers).

-- name: str_holds --
-- Does string predicate `ps` hold for staged property `sp`? (code-point order)
CASE ps.op
    WHEN 'eq' THEN sp.v_str = ps.v
    WHEN 'in' THEN sp.v_str = ps.v
    WHEN 'ne' THEN sp.v_str <> ps.v
    WHEN 'gt' THEN sp.v_str > ps.v
    WHEN 'ge' THEN sp.v_str >= ps.v
    WHEN 'lt' THEN sp.v_str < ps.v
    WHEN 'le' THEN sp.v_str <= ps.v
    WHEN 'prefix' THEN starts_with(sp.v_str, ps.v)
    ELSE FALSE
END

-- name: num_holds --
-- Does number/bool/datetime predicate `pn` hold for `sp`? (hi, lo) compare exactly,
-- lexicographically.
CASE pn.op
    WHEN 'eq' THEN sp.hi = pn.hi AND sp.lo = pn.lo
    WHEN 'in' THEN sp.hi = pn.hi AND sp.lo = pn.lo
    WHEN 'ne' THEN sp.hi <> pn.hi OR sp.lo <> pn.lo
    WHEN 'gt' THEN sp.hi > pn.hi OR (sp.hi = pn.hi AND sp.lo > pn.lo)
    WHEN 'ge' THEN sp.hi > pn.hi OR (sp.hi = pn.hi AND sp.lo >= pn.lo)
    WHEN 'lt' THEN sp.hi < pn.hi OR (sp.hi = pn.hi AND sp.lo < pn.lo)
    WHEN 'le' THEN sp.hi < pn.hi OR (sp.hi = pn.hi AND sp.lo <= pn.lo)
    ELSE FALSE
END

-- name: route --
-- The counting algorithm for a whole batch (DESIGN.md §5), in three steps:
-- 1. candidates: each group's anchor predicate (equality when it has one) is looked
--    up for the staged properties; groups made only of not_exists are candidates for
--    every message;
-- 2. count, per candidate (message, group), the predicates that hold, and the
--    not_exists predicates that are violated;
-- 3. keep the groups whose count equals their size with no violation, and reduce to
--    distinct (message, subscription) pairs of enlisted subscriptions.
-- The cost grows with the matching anchors, not with the number of subscriptions.
sp AS (
    SELECT s.msg, p.id AS prop, s.fam, s.v_str, s.hi, s.lo, s.v_int
    FROM staged s
    JOIN mb_property p ON p.name = s.name
),
anchored AS (
    SELECT sp.msg, g.id AS grp
    FROM sp
    JOIN mb_pred_str ps ON ps.prop = sp.prop AND ps.v = sp.v_str
    JOIN mb_group g ON g.anchor = ps.pred
    WHERE ps.op IN ('eq', 'in')
    UNION ALL
    SELECT sp.msg, g.id
    FROM sp
    JOIN mb_pred_num pn
      ON pn.prop = sp.prop AND pn.fam = sp.fam AND pn.hi = sp.hi AND pn.lo = sp.lo
    JOIN mb_group g ON g.anchor = pn.pred
    WHERE pn.op IN ('eq', 'in')
    UNION ALL
    SELECT sp.msg, g.id
    FROM mb_group g
    JOIN mb_pred_str ps ON ps.pred = g.anchor
    JOIN sp ON sp.prop = ps.prop AND sp.fam = 1
    WHERE ps.op NOT IN ('eq', 'in') AND {str_holds}
    UNION ALL
    SELECT sp.msg, g.id
    FROM mb_group g
    JOIN mb_pred_num pn ON pn.pred = g.anchor
    JOIN sp ON sp.prop = pn.prop AND sp.fam = pn.fam
    WHERE pn.op NOT IN ('eq', 'in') AND {num_holds}
    UNION ALL
    SELECT sp.msg, g.id
    FROM mb_group g
    JOIN mb_pred_mask pm ON pm.pred = g.anchor
    JOIN sp ON sp.prop = pm.prop
    WHERE (sp.v_int & pm.mask) <> 0
    UNION ALL
    SELECT sp.msg, g.id
    FROM mb_group g
    JOIN mb_pred_exists pe ON pe.pred = g.anchor AND pe.op = 'exists'
    JOIN sp ON sp.prop = pe.prop
    UNION ALL
    SELECT b.msg, g.id
    FROM batch b
    CROSS JOIN mb_group g
    WHERE g.anchor IS NULL
),
cand AS (
    SELECT DISTINCT msg, grp FROM anchored
),
cp AS (
    SELECT c.msg, c.grp, gp.pred
    FROM cand c
    JOIN mb_group_pred gp ON gp.grp = c.grp
),
held AS (
    SELECT cp.msg, cp.grp
    FROM cp
    JOIN mb_pred_str ps ON ps.pred = cp.pred
    JOIN sp ON sp.msg = cp.msg AND sp.prop = ps.prop
    WHERE sp.fam = 1 AND {str_holds}
    UNION ALL
    SELECT cp.msg, cp.grp
    FROM cp
    JOIN mb_pred_num pn ON pn.pred = cp.pred
    JOIN sp ON sp.msg = cp.msg AND sp.prop = pn.prop AND sp.fam = pn.fam
    WHERE {num_holds}
    UNION ALL
    SELECT cp.msg, cp.grp
    FROM cp
    JOIN mb_pred_mask pm ON pm.pred = cp.pred
    JOIN sp ON sp.msg = cp.msg AND sp.prop = pm.prop
    WHERE (sp.v_int & pm.mask) <> 0
    UNION ALL
    SELECT cp.msg, cp.grp
    FROM cp
    JOIN mb_pred_exists pe ON pe.pred = cp.pred AND pe.op = 'exists'
    JOIN sp ON sp.msg = cp.msg AND sp.prop = pe.prop
),
violated AS (
    SELECT DISTINCT cp.msg, cp.grp
    FROM cp
    JOIN mb_pred_exists pe ON pe.pred = cp.pred AND pe.op = 'not_exists'
    JOIN sp ON sp.msg = cp.msg AND sp.prop = pe.prop
),
counted AS (
    SELECT msg, grp, count(*) AS n FROM held GROUP BY msg, grp
),
matched AS (
    SELECT DISTINCT c.msg, g.sub
    FROM cand c
    JOIN mb_group g ON g.id = c.grp
    LEFT JOIN counted k ON k.msg = c.msg AND k.grp = c.grp
    LEFT JOIN violated v ON v.msg = c.msg AND v.grp = c.grp
    WHERE coalesce(k.n, 0) = g.n_pos AND v.msg IS NULL
)
SELECT m.msg, s.id, s.host, s.priority, s.state, s.kind, s.instance_id, s.ordered,
       s.service, s.correlation, s.ordered_by
FROM matched m
JOIN mb_subscription s ON s.id = m.sub
WHERE s.state <> 'unenlisted'
ORDER BY m.msg, s.id
