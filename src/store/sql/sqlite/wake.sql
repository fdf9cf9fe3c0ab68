-- Wakes every subscriber (a member left: rebalance now).
UPDATE {table}_changes SET generation = generation + 1 WHERE id = 1
