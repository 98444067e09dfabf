-- Schema version 1, revision 4 (see migrate.go): flows take turns counted
-- in units.
--
-- Before it, a waiter moved its flow's next finish tag on by 1/weight
-- whatever it weighed, so a flow of requests of 500,000 tokens was granted
-- as many requests as a flow of requests of 1,000: a hundred times its
-- part of the tokens. Now a waiter moves it on by its turn's cost per
-- weight, as the local queues and the Redis store count turns: its units
-- in steps of the key's limit/{{turnSteps}}, rounded up (driver.TurnCost),
-- so a waiter of one unit costs 1 as before; finish tags stop at
-- {{maxTag}} (driver.MaxTag), past which a backlog is served by arrival.
--
-- It replaces inflight_enqueue and inflight_unqueue, with the same
-- signatures. A process of an earlier release calls them too: turns are
-- counted alike across the fleet from the migration on.

-- inflight_enqueue queues ticket t, of units, on each of its keys,
-- numbering its arrival in the fleet's order. A flow's start tag in a
-- class is its finish tag there or the class's virtual time, whichever is
-- later, and its next finish tag is that plus the turn's cost per weight;
-- its place sorts by the tag to the microunit (as Redis's queue sorts), so
-- that turns of flows that meet, 1/3+1/3+1/3 against 1, go by arrival.
CREATE OR REPLACE FUNCTION inflight_enqueue(f text, keys text[], limits bigint[], t text, r smallint, fl text, weight int, p text,
	now bigint, ttl bigint, units int) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	arrival bigint := nextval('inflight_arrival');
	k text;
	v float8;
	tag float8;
	step bigint;
	finish float8;
	s bigint;
BEGIN
	FOR i IN 1 .. coalesce(array_length(keys, 1), 0) LOOP
		k := keys[i];
		PERFORM inflight_unqueue(f, k, t, true); -- a place left on one of its keys
		UPDATE inflight_key x SET seq = x.seq + 1 WHERE x.fleet = f AND x.key = k RETURNING x.vt[r + 1], x.seq INTO v, s;
		SELECT greatest(v, coalesce(x.finish, 0)) INTO tag FROM inflight_flow x WHERE x.fleet = f AND x.key = k AND x.rank = r AND x.flow = fl;
		IF NOT FOUND THEN
			tag := v;
		END IF;
		step := greatest(1, limits[i] / {{turnSteps}});
		finish := least(tag + ((greatest(units, 1) + step - 1) / step)::float8 / weight, {{maxTag}});
		INSERT INTO inflight_flow AS x (fleet, key, rank, flow, finish, base, n) VALUES (f, k, r, fl, finish, tag, 1)
			ON CONFLICT (fleet, key, rank, flow) DO UPDATE SET finish = EXCLUDED.finish, n = x.n + 1,
				base = CASE WHEN x.n = 0 THEN EXCLUDED.base ELSE x.base END;
		INSERT INTO inflight_ticket (fleet, key, ticket, rank, tag, seq, proc, flow, arrival, finish, keys, limits, expires, units)
			VALUES (f, k, t, r, round(tag::numeric, 6)::float8, s, p, fl, arrival, finish, keys, limits, now + 3 * ttl, units);
	END LOOP;
END $$;

-- inflight_unqueue takes ticket out of k's queue, with its flow's counts,
-- and reports whether it was queued. A flow's turns in a class are
-- charged from its first waiter queued while it had none there (base) and
-- as each is granted (base moves to the granted ticket's finish tag): if
-- its last waiter there leaves without a grant, its finish tag goes back
-- to base. A waiter that leaves while others of its flow wait gives its
-- turn back if it was the newest (the flow's finish tag is its own, and
-- below {{maxTag}}, where several waiters share it).
CREATE OR REPLACE FUNCTION inflight_unqueue(f text, k text, t text, leaving bool) RETURNS bool LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	q inflight_ticket;
	fl inflight_flow;
BEGIN
	DELETE FROM inflight_ticket x WHERE x.fleet = f AND x.key = k AND x.ticket = t RETURNING * INTO q;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	SELECT * INTO fl FROM inflight_flow x WHERE x.fleet = f AND x.key = k AND x.rank = q.rank AND x.flow = q.flow;
	IF FOUND THEN
		IF NOT leaving AND q.finish > coalesce(fl.base, 0) THEN
			fl.base := q.finish;
		END IF;
		IF leaving AND fl.finish = q.finish AND q.finish < {{maxTag}} THEN
			fl.finish := q.tag; -- the newest gives its turn back
		END IF;
		fl.n := fl.n - 1;
		IF fl.n <= 0 THEN
			IF leaving AND fl.base IS NOT NULL THEN
				fl.finish := fl.base;
			END IF;
			fl.base := NULL;
			fl.n := 0;
		END IF;
		IF fl.n = 0 AND fl.finish IS NULL THEN
			DELETE FROM inflight_flow x WHERE x.fleet = f AND x.key = k AND x.rank = q.rank AND x.flow = q.flow;
		ELSE
			UPDATE inflight_flow x SET finish = fl.finish, base = fl.base, n = fl.n
				WHERE x.fleet = f AND x.key = k AND x.rank = q.rank AND x.flow = q.flow;
		END IF;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k) THEN
		-- The queue is empty: tags start from 0 after every backlog.
		DELETE FROM inflight_flow x WHERE x.fleet = f AND x.key = k;
		UPDATE inflight_key x SET vt = '{0,0,0}', seq = 0 WHERE x.fleet = f AND x.key = k;
	END IF;
	RETURN true;
END $$;
