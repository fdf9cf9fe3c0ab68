-- ?1 JSON array of role names. Adds a blank row for each missing role.
INSERT OR IGNORE INTO {table} (role) SELECT value FROM json_each(?1)
