-- ?1 name, ?2 definition. Records the definition unless one is recorded.
INSERT INTO {table}_partitions (name, definition, epoch, settled_at_ms)
VALUES (?1, ?2, 1, {now_ms})
ON CONFLICT (name) DO NOTHING
