-- ?1 name, ?2 definition, ?3 settle in ms. The first record of a partition
-- (epoch 1), unless one is recorded.
INSERT INTO {table}_partitions (name, definition, epoch, settled_at_ms)
VALUES (?1, ?2, 1, {now_ms} + ?3)
ON CONFLICT (name) DO NOTHING
