-- $1 name, $2 definition. Records the definition unless one is recorded.
-- The record in force is read by a second statement, which sees a
-- concurrent winner this one's snapshot could not.
INSERT INTO {table}_partitions (name, definition, epoch, settled_at)
VALUES ($1, $2, 1, clock_timestamp())
ON CONFLICT (name) DO NOTHING
