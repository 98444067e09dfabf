-- Schema version 1, revision 1 (see migrate.go): budgets per minute
-- (driver.BudgetCall).

-- A budget's tokens charged in one step (a second of the database's
-- clock), per part: all, input, output.
CREATE TABLE inflight_budget (
	fleet text NOT NULL,
	key text NOT NULL,
	step bigint NOT NULL,
	t0 bigint NOT NULL,
	t1 bigint NOT NULL,
	t2 bigint NOT NULL,
	PRIMARY KEY (fleet, key, step)
);

-- For inflight_gc: the steps past, of every budget.
CREATE INDEX inflight_budget_step ON inflight_budget (fleet, step);

-- inflight_budget charges cost to the budget k if it fits, or, with
-- correct, changes by cost the charge made in step charged_in
-- (driver.BudgetCall). The calls of one budget are serialized by a
-- transaction advisory lock, and the clock is read after it (READ
-- COMMITTED: each statement sees what the call before committed). They
-- commit asynchronously: a crash of the database may forget the charges
-- of its last moments (wal_writer_delay, 200 ms by default), which lets a
-- few more requests start in that minute; a budget is a rate, and the
-- caps in flight are the leases'. It returns {charged (0 or 1), the
-- current step, used (3), at, binding, now}.
CREATE FUNCTION inflight_budget(f text, k text, correct bool, move bool, charged_in bigint, limits bigint[], cost bigint[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now bigint;
	cur bigint;
	first bigint;
	used bigint[];
	d bigint[] := cost;
	s bigint;
	fits bool := true;
	at bigint := 0;
	binding bigint := 0;
	lft bigint;
	r record;
BEGIN
	PERFORM inflight_begin(true);
	PERFORM pg_advisory_xact_lock(hashtextextended('inflight_budget' || chr(31) || f || chr(31) || k, 0));
	now := inflight_now_us() / 1000;
	-- A clock set back does not move the window back: it stays at the
	-- latest step charged.
	SELECT greatest(now / 1000, max(x.step)) INTO cur FROM inflight_budget x WHERE x.fleet = f AND x.key = k;
	first := cur - 60;
	DELETE FROM inflight_budget x WHERE x.fleet = f AND x.key = k AND x.step < first;
	SELECT ARRAY[coalesce(sum(x.t0), 0), coalesce(sum(x.t1), 0), coalesce(sum(x.t2), 0)]::bigint[] INTO used
		FROM inflight_budget x WHERE x.fleet = f AND x.key = k;
	IF correct AND move THEN
		IF charged_in <> cur THEN
			UPDATE inflight_budget x SET t0 = x.t0 - cost[1], t1 = x.t1 - cost[2], t2 = x.t2 - cost[3]
				WHERE x.fleet = f AND x.key = k AND x.step = charged_in AND charged_in >= first;
			IF FOUND THEN
				used := ARRAY[used[1] - cost[1], used[2] - cost[2], used[3] - cost[3]];
			END IF;
			INSERT INTO inflight_budget AS x (fleet, key, step, t0, t1, t2) VALUES (f, k, cur, cost[1], cost[2], cost[3])
				ON CONFLICT ON CONSTRAINT inflight_budget_pkey DO UPDATE SET t0 = x.t0 + EXCLUDED.t0, t1 = x.t1 + EXCLUDED.t1, t2 = x.t2 + EXCLUDED.t2;
			used := ARRAY[used[1] + cost[1], used[2] + cost[2], used[3] + cost[3]];
		END IF;
		RETURN ARRAY[1, cur, used[1], used[2], used[3], 0, 0, now];
	END IF;
	IF correct THEN
		s := charged_in;
		IF charged_in < first OR charged_in > cur THEN
			s := cur; -- a debt, or nothing to return
			d := ARRAY[greatest(cost[1], 0), greatest(cost[2], 0), greatest(cost[3], 0)];
		END IF;
	ELSE
		s := cur;
		FOR p IN 1..3 LOOP
			IF limits[p] > 0 AND used[p] > 0 AND used[p] + cost[p] > limits[p] THEN
				fits := false;
			END IF;
		END LOOP;
	END IF;
	IF fits THEN
		IF d <> ARRAY[0, 0, 0]::bigint[] THEN
			INSERT INTO inflight_budget AS x (fleet, key, step, t0, t1, t2) VALUES (f, k, s, d[1], d[2], d[3])
				ON CONFLICT ON CONSTRAINT inflight_budget_pkey DO UPDATE SET t0 = x.t0 + EXCLUDED.t0, t1 = x.t1 + EXCLUDED.t1, t2 = x.t2 + EXCLUDED.t2;
		END IF;
		RETURN ARRAY[1, cur, used[1] + d[1], used[2] + d[2], used[3] + d[3], 0, 0, now];
	END IF;
	FOR p IN 1..3 LOOP
		IF limits[p] > 0 AND used[p] > 0 AND used[p] + cost[p] > limits[p] THEN
			lft := used[p];
			FOR r IN SELECT x.step, x.t0, x.t1, x.t2 FROM inflight_budget x WHERE x.fleet = f AND x.key = k ORDER BY x.step LOOP
				lft := lft - CASE p WHEN 1 THEN r.t0 WHEN 2 THEN r.t1 ELSE r.t2 END;
				IF lft <= 0 OR lft + cost[p] <= limits[p] THEN
					IF (r.step + 61) * 1000 > at THEN
						at := (r.step + 61) * 1000;
						binding := p - 1;
					END IF;
					EXIT;
				END IF;
			END LOOP;
		END IF;
	END LOOP;
	RETURN ARRAY[0, cur, used[1], used[2], used[3], at, binding, now];
END $$;

-- inflight_gc (schema version 1's) deletes also, a few at a time, the
-- steps of budgets nobody calls any more. (The rows of idle keys are
-- swept apart: sweep.sql, revision 13.)
CREATE OR REPLACE FUNCTION inflight_gc(f text, now bigint) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	DELETE FROM inflight_lease x WHERE x.ctid IN
		(SELECT y.ctid FROM inflight_lease y WHERE y.fleet = f AND y.expires < now - 600000 LIMIT 64 FOR UPDATE SKIP LOCKED);
	DELETE FROM inflight_tomb x WHERE x.ctid IN
		(SELECT y.ctid FROM inflight_tomb y WHERE y.fleet = f AND y.until <= now LIMIT 64 FOR UPDATE SKIP LOCKED);
	DELETE FROM inflight_proc x WHERE x.ctid IN
		(SELECT y.ctid FROM inflight_proc y WHERE y.fleet = f AND y.alive_until < now - 600000 LIMIT 16 FOR UPDATE SKIP LOCKED);
	DELETE FROM inflight_budget x WHERE x.ctid IN
		(SELECT y.ctid FROM inflight_budget y WHERE y.fleet = f AND y.step < now / 1000 - 60 LIMIT 64 FOR UPDATE SKIP LOCKED);
END $$;
