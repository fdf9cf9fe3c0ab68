-- ?1 name, ?2 definition, ?3 the epoch expected (at least 1), ?4 settle in
-- ms. Replaces the definition only if its epoch is still ?3, bumps the epoch
-- and starts the settle window by SQLite's clock. (Epoch 0, no record yet,
-- inserts instead.) Run in one transaction with the read back and the wake-up.
UPDATE {table}_partitions SET
    definition = ?2,
    epoch = epoch + 1,
    settled_at_ms = {now_ms} + ?4
WHERE name = ?1 AND epoch = ?3
