-- Schema version 1, revision 9 (see migrate.go): serving carries a key's
-- count in units from grant to grant.
--
-- Revision 8 counted a key's units once per serving and again after each
-- grant, and each grant's room check (inflight_can_take, inflight_room)
-- deleted the key's expired leases and counted them once more: three
-- scans of the key's leases per grant, under its lock. Serving now counts
-- once and adds what each grant adds, and checks the room on the key it
-- serves with that count. The answers are the same; inflight_room and
-- inflight_serve keep their signatures (a process of an earlier release
-- calls these), and the functions that take the count are new ones.

-- inflight_room_of is inflight_room where the caller has k's count in
-- units, c, with k's expired leases deleted.
CREATE OR REPLACE FUNCTION inflight_room_of(f text, k text, lim bigint, t text, arrival bigint, now bigint, claim bigint, c bigint)
	RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	free bigint := lim - c;
	u inflight_ticket;
BEGIN
	IF free <= 0 THEN
		RETURN free;
	END IF;
	FOR i IN 1..64 LOOP
		SELECT * INTO u FROM inflight_ticket x WHERE x.fleet = f AND x.key = k AND x.urgent
			ORDER BY x.arrival LIMIT 1;
		IF NOT FOUND THEN
			RETURN free;
		END IF;
		IF inflight_dead(f, u.proc, now, claim) OR u.expires <= now THEN
			PERFORM inflight_drop(f, k, u.keys, u.ticket);
		ELSE
			-- Its units are kept, unless they are over the limit: it can
			-- never be served under it (its process refuses it).
			IF u.ticket IS DISTINCT FROM t AND (arrival IS NULL OR u.arrival < arrival) AND u.units <= lim THEN
				free := free - u.units;
			END IF;
			RETURN free;
		END IF;
	END LOOP;
	-- 64 dead ones dropped: the next one's place is kept without a look
	-- at its process.
	RETURN free - coalesce((SELECT x.units FROM inflight_ticket x WHERE x.fleet = f AND x.key = k AND x.urgent
		ORDER BY x.arrival LIMIT 1), 1);
END $$;

-- inflight_room (see units.sql), through inflight_room_of.
CREATE OR REPLACE FUNCTION inflight_room(f text, k text, lim bigint, t text, arrival bigint, now bigint, claim bigint) RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires <= now; -- expired
	RETURN inflight_room_of(f, k, lim, t, arrival, now, claim, inflight_units(f, k, now));
END $$;

-- inflight_can_take (see units.sql) where serving k has k's count, c.
CREATE OR REPLACE FUNCTION inflight_can_take(f text, k text, keys text[], limits bigint[], t text, arrival bigint, units int,
	now bigint, claim bigint, c bigint) RETURNS bool LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	FOR i IN 1..array_length(keys, 1) LOOP
		IF keys[i] <> k AND NOT inflight_trylock(f, keys[i]) THEN
			RETURN false;
		END IF;
		IF keys[i] = k THEN
			IF inflight_room_of(f, k, limits[i], t, arrival, now, claim, c) < units THEN
				RETURN false;
			END IF;
		ELSIF inflight_room(f, keys[i], limits[i], t, arrival, now, claim) < units THEN
			RETURN false;
		END IF;
		IF keys[i] <> k AND inflight_behind_heavy(f, keys[i], t, now) THEN
			RETURN false;
		END IF;
	END LOOP;
	RETURN true;
END $$;

-- inflight_serve: see serve.sql; it carries the count (above).
CREATE OR REPLACE FUNCTION inflight_serve(f text, k text, lim bigint, now bigint, claim bigint, start int) RETURNS int LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	i int := start;
	steps int := 0;
	passed text[] := '{}';
	blocker inflight_ticket; -- the first heavy waiter it went past
	q inflight_ticket;
	c bigint;
	ls bigint[];
	pt text;
	held bool;
BEGIN
	IF NOT EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k) THEN
		RETURN 0; -- nobody waits: the common case, at one probe's cost
	END IF;
	-- Once: no lease expires while the call runs (now is fixed), and only
	-- a grant changes k's leases meanwhile (inflight_drop and inflight_room
	-- take tickets out, not leases): a grant adds its units, unless its
	-- ticket holds a lease on k already (put back), which it keeps.
	DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires <= now; -- expired
	c := inflight_units(f, k, now);
	LOOP
		IF c >= lim THEN
			RETURN 0;
		END IF;
		SELECT * INTO q FROM inflight_ticket x WHERE x.fleet = f AND x.key = k
			ORDER BY x.rank, x.tag, x.seq OFFSET i LIMIT 1;
		IF NOT FOUND THEN
			-- A newcomer that may not pass a heavy waiter finds it keeps
			-- the room (see inflight_admit_passing).
			IF blocker.ticket IS NOT NULL AND current_setting('inflight.pass', true) IS DISTINCT FROM 'on' THEN
				RETURN -1;
			END IF;
			RETURN 0;
		END IF;
		IF i >= start + {{passScan}} OR steps >= 4 * {{passScan}} THEN
			IF blocker.ticket IS NOT NULL THEN
				RETURN -1;
			END IF;
			RETURN i + 1;
		END IF;
		steps := steps + 1;
		-- A ticket of one key is served under the caller's limit; one of
		-- several under the limits its calls keep, k's at most lim.
		IF array_length(q.keys, 1) = 1 THEN
			ls := ARRAY[lim];
		ELSE
			ls := q.limits;
			FOR j IN 1..array_length(q.keys, 1) LOOP
				IF q.keys[j] = k THEN
					ls[j] := least(ls[j], lim);
				END IF;
			END LOOP;
		END IF;
		IF inflight_dead(f, q.proc, now, claim) OR q.expires <= now THEN
			PERFORM inflight_drop(f, k, q.keys, q.ticket);
		ELSIF q.units <= lim AND (c + q.units > lim
				OR q.units > 1 AND inflight_room_of(f, k, lim, q.ticket, q.arrival, now, claim, c) < q.units) THEN
			-- A heavy waiter: k's room waits for its units, counted or
			-- with the place an older urgent ticket keeps set aside (one
			-- unit's waiter is passed over then, as before units). One of
			-- one key is passed up to its bound.
			IF array_length(q.keys, 1) > 1 OR q.passed_units >= {{passFactor}} * q.units THEN
				RETURN -1;
			END IF;
			IF blocker.ticket IS NULL THEN
				blocker := q;
			END IF;
			i := i + 1;
		ELSIF (blocker.ticket IS NULL OR array_length(q.keys, 1) = 1)
				AND inflight_can_take(f, k, q.keys, ls, q.ticket, q.arrival, q.units, now, claim, c) THEN
			held := EXISTS (SELECT 1 FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.lease = q.ticket);
			PERFORM inflight_grant(f, q.keys, q.ticket, q.proc, now, claim, q.units);
			IF NOT held THEN
				c := c + q.units;
			END IF;
			IF blocker.ticket IS NOT NULL THEN
				PERFORM inflight_pass(f, k, blocker, q.flow, q.rank, q.units);
			END IF;
			FOREACH pt IN ARRAY passed LOOP
				-- At maxPassed grants passing it over, a ticket is urgent.
				UPDATE inflight_ticket x SET passed = x.passed + 1, urgent = x.urgent OR x.passed + 1 >= {{maxPassed}}
					WHERE x.fleet = f AND x.key = k AND x.ticket = pt;
			END LOOP;
		ELSE
			IF array_length(q.keys, 1) > 1 THEN
				passed := passed || q.ticket;
			END IF;
			i := i + 1;
		END IF;
	END LOOP;
END $$;
