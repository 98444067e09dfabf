-- Schema version 1, revision 19 (see migrate.go): a serving that goes on
-- past its look bound knows the waiters of several keys before it.
--
-- Serving looks at {{passScan}} waiters from the head; where it stops short
-- with room left, a newcomer looks at {{passScan}} more, and a release of
-- several pairs on the key goes on too (inflight_serve with start > 0).
-- Such a serving began with nothing passed: a waiter of several keys
-- before start, passed for want of room on another of its keys, was not
-- known to it, so once a grant behind it left too little room on the key
-- for its units (heavy: it keeps the room, driver.ReleaseCall) the serving
-- went on granting light waiters behind it, and a newcomer took the rest
-- (fleettest's SeveralKeysWaiterBeforeTheLookBound; memstore's serving,
-- which looks again from the head after each grant, stops there). Now a
-- serving from start > 0 reads the waiters of several keys before start
-- (one query, as each waiter's is) and stops where one of them is heavy,
-- at once or after a grant, as a serving from the head stops at it. It
-- keeps its signature and the meaning of its answers.

-- inflight_serve: see serving.sql; from start > 0, with the waiters of
-- several keys before start counted as passed (above).
CREATE OR REPLACE FUNCTION inflight_serve(f text, k text, lim bigint, now bigint, claim bigint, start int) RETURNS int LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	i int := start;
	steps int := 0;
	passed text[] := '{}';
	passed_u int[] := '{}'; -- the units of each of passed, and of those before start
	blocker inflight_ticket; -- the first heavy waiter it went past
	q inflight_ticket;
	c bigint;
	ls bigint[];
	pt text;
	held bool;
	bound bool;
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
	IF start > 0 THEN
		-- Going on past the look bound: the waiters of several keys
		-- before start (of live processes, their units at most lim and
		-- more than one) are those a serving from the head passed (it
		-- would have stopped at one heavy, dropped one dead), and count
		-- as passed by this one. One heavy now keeps the room.
		SELECT coalesce(array_agg(x.units), '{}') INTO passed_u FROM (SELECT y.units, y.keys, y.proc, y.expires
				FROM inflight_ticket y WHERE y.fleet = f AND y.key = k ORDER BY y.rank, y.tag, y.seq LIMIT start) x
			WHERE array_length(x.keys, 1) > 1 AND x.units > 1 AND x.units <= lim AND x.expires > now
				AND NOT inflight_dead(f, x.proc, now, claim);
		IF c < lim THEN
			FOR j IN 1..coalesce(array_length(passed_u, 1), 0) LOOP
				IF c + passed_u[j] > lim THEN
					RETURN -1;
				END IF;
			END LOOP;
		END IF;
	END IF;
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
			bound := false;
			IF blocker.ticket IS NOT NULL THEN
				PERFORM inflight_pass(f, k, blocker, q.flow, q.rank, q.units);
				SELECT x.passed_units >= {{passFactor}} * x.units INTO bound FROM inflight_ticket x
					WHERE x.fleet = f AND x.key = k AND x.ticket = blocker.ticket;
			END IF;
			FOREACH pt IN ARRAY passed LOOP
				-- At maxPassed grants passing it over, a ticket is urgent.
				UPDATE inflight_ticket x SET passed = x.passed + 1, urgent = x.urgent OR x.passed + 1 >= {{maxPassed}}
					WHERE x.fleet = f AND x.key = k AND x.ticket = pt;
			END LOOP;
			-- The heavy waiter it went past has been passed its bound, or a
			-- waiter of several keys it passed is heavy now: serving stops
			-- there, as it would meeting it now.
			IF c < lim AND bound THEN
				RETURN -1;
			END IF;
			IF c < lim THEN
				FOR j IN 1..coalesce(array_length(passed_u, 1), 0) LOOP
					IF passed_u[j] > 1 AND passed_u[j] <= lim AND c + passed_u[j] > lim THEN
						RETURN -1;
					END IF;
				END LOOP;
			END IF;
		ELSE
			IF array_length(q.keys, 1) > 1 THEN
				passed := passed || q.ticket;
				passed_u := passed_u || q.units;
			END IF;
			i := i + 1;
		END IF;
	END LOOP;
END $$;
