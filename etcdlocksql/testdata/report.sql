-- report.sql: run by psql -1 -v ON_ERROR_STOP=1 -v token=TOKEN.
-- Fence first. When a holder with a newer token has written, the insert
-- changes no row and returns none, \gset fails, and psql stops and rolls
-- the transaction back: nothing below runs.
INSERT INTO etcdlock_fence (resource, token) VALUES ('reports', :token)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token
WHERE etcdlock_fence.token <= excluded.token
RETURNING token AS fenced \gset
UPDATE report SET body = 'from psql', token = :token WHERE id = 1;
