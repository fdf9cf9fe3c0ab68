-- ?1 instance id. Removes its presence record.
DELETE FROM {table}_members WHERE instance_id = ?1
