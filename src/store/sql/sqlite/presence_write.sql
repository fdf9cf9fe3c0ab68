-- ?1 instance id, ?2 address, ?3 candidate, ?4 ttl in ms, ?5 route-table
-- fingerprint. Writes this instance's presence record.
INSERT INTO {table}_members (instance_id, address, candidate, expires_at_ms, routes)
VALUES (?1, ?2, ?3, {now_ms} + ?4, ?5)
ON CONFLICT (instance_id) DO UPDATE
    SET address = excluded.address, candidate = excluded.candidate,
        expires_at_ms = excluded.expires_at_ms, routes = excluded.routes
