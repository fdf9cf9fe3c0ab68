-- ?1 instance id. Ends its presence record now (kept, so readers of
-- presence changes see it go).
UPDATE {table}_members SET expires_at_ms = {now_ms}
WHERE instance_id = ?1 AND expires_at_ms > {now_ms}
