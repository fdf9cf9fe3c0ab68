-- Each row's `changed` is the generation of the last change that began or
-- ended a term on it (or added it): a reader of changes asks for the rows
-- changed after the generation it last read. SQLite has one writer at a
-- time, so generations are in commit order.
CREATE TRIGGER IF NOT EXISTS {table}_term_mark AFTER UPDATE OF token, holder_id ON {table}
FOR EACH ROW WHEN NEW.token IS NOT OLD.token OR NEW.holder_id IS NOT OLD.holder_id
BEGIN
    UPDATE {table}_changes SET generation = generation + 1 WHERE id = 1;
    UPDATE {table} SET changed = (SELECT generation FROM {table}_changes WHERE id = 1)
    WHERE role = NEW.role;
END;
CREATE TRIGGER IF NOT EXISTS {table}_insert_mark AFTER INSERT ON {table} FOR EACH ROW
BEGIN
    UPDATE {table}_changes SET generation = generation + 1 WHERE id = 1;
    UPDATE {table} SET changed = (SELECT generation FROM {table}_changes WHERE id = 1)
    WHERE role = NEW.role;
END;
-- A presence record's `changed`: the generation of the last change that
-- added, changed, revived or ended it (a renewal alone is no change).
CREATE TRIGGER IF NOT EXISTS {table}_member_insert AFTER INSERT ON {table}_members
FOR EACH ROW
BEGIN
    UPDATE {table}_changes SET generation = generation + 1 WHERE id = 1;
    UPDATE {table}_members SET changed = (SELECT generation FROM {table}_changes WHERE id = 1)
    WHERE instance_id = NEW.instance_id;
END;
CREATE TRIGGER IF NOT EXISTS {table}_member_mark
AFTER UPDATE OF address, candidate, routes, expires_at_ms ON {table}_members
FOR EACH ROW WHEN NEW.address IS NOT OLD.address OR NEW.candidate IS NOT OLD.candidate
    OR NEW.routes IS NOT OLD.routes OR OLD.expires_at_ms <= {now_ms}
    OR NEW.expires_at_ms <= {now_ms}
BEGIN
    UPDATE {table}_changes SET generation = generation + 1 WHERE id = 1;
    UPDATE {table}_members SET changed = (SELECT generation FROM {table}_changes WHERE id = 1)
    WHERE instance_id = NEW.instance_id;
END;
