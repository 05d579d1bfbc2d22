-- DuckDB: the batch is an Arrow table registered on the publishing connection.

-- name: staged --
staged AS (SELECT * FROM mb_staged_batch),
batch AS (SELECT CAST(range AS INTEGER) AS msg FROM range(CAST($n AS BIGINT)))
