-- Schema version 1, revision 20 (see migrate.go): a waiter of several
-- keys whose other key is busy keeps the room of the key served.
--
-- Serving a key's queue locks a waiter's other keys only if no other call
-- holds them (inflight_trylock: a wait there could deadlock), and a waiter
-- whose key was busy was passed over as one without room there. But the
-- call that holds it is often the waiter's own ask, which locks its keys
-- in their order and waits for the key served: the serving went on to a
-- lighter waiter behind it and granted it the room the first one fitted,
-- and the ask that served the key next found it kept for nobody but too
-- small (fleettest's HeavyWaiterFirstOnSeveralKeys, behind PgBouncer: a
-- heavy waiter on {tokens, a} that fitted tokens once a release freed it
-- was passed, its a held by its own ask, and a light waiter on {tokens,
-- b} admitted first). Memstore and Redis, which lock nothing per key,
-- grant the first waiter there. Now a waiter of several keys that has
-- room for its units on the key served, and on each of its other keys but
-- the busy ones (as they were last committed), keeps the key's room as a
-- heavy waiter of several keys does (serving stops there, -1), and is
-- woken (a grant's notification, though nothing is granted yet: its next
-- call asks as a claim does, driver.Listener): its ask, once the busy key
-- is free, serves the key. Without the wake-up the room would idle until
-- its next look, a claim window later, when the call that holds the key
-- is another than its own ask. It keeps its signature and the meaning of
-- its answers.

-- inflight_serve: see lookbound.sql; a waiter of several keys passed over
-- only for a busy key keeps the room (above).
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
	busy bool;
	fits bool;
	u inflight_ticket; -- a busy key's oldest urgent ticket
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
			-- Passed over: for want of room on another of its keys, or for
			-- a key another call holds. Only busy, with room on k and on
			-- its other keys (a busy one's as last committed), it keeps k's
			-- room (above). Room as inflight_can_take has it: on k under
			-- its own limit there (at most lim); on a busy key, read
			-- without its lock, less the place kept for its oldest urgent
			-- ticket (inflight_room_of's, unless that is q or came later;
			-- one of a dead process counted too), and with no heavy waiter
			-- before it there (one the busy key's serving would pass it
			-- over for, freed or not).
			IF blocker.ticket IS NULL AND array_length(q.keys, 1) > 1 AND q.units <= lim THEN
				busy := false;
				fits := true;
				FOR j IN 1..array_length(q.keys, 1) LOOP
					EXIT WHEN NOT fits;
					IF q.keys[j] = k THEN
						fits := inflight_room_of(f, k, ls[j], q.ticket, q.arrival, now, claim, c) >= q.units;
					ELSIF NOT inflight_trylock(f, q.keys[j]) THEN
						busy := true;
						SELECT * INTO u FROM inflight_ticket x WHERE x.fleet = f AND x.key = q.keys[j] AND x.urgent
							AND NOT (0 = ANY (x.limits)) ORDER BY x.arrival LIMIT 1;
						fits := inflight_units(f, q.keys[j], now) + q.units
								+ CASE WHEN u.ticket IS NOT NULL AND u.ticket <> q.ticket
									AND (q.arrival IS NULL OR u.arrival < q.arrival) AND u.units <= ls[j]
									THEN u.units ELSE 0 END <= ls[j]
							AND NOT inflight_behind_heavy(f, q.keys[j], q.ticket, now);
					ELSE
						fits := inflight_room(f, q.keys[j], ls[j], q.ticket, q.arrival, now, claim) >= q.units
							AND NOT inflight_behind_heavy(f, q.keys[j], q.ticket, now);
					END IF;
				END LOOP;
				IF busy AND fits THEN
					-- Woken, it asks again now: its ask locks the busy key
					-- once it is free, then serves k.
					PERFORM pg_notify(inflight_channel(f, q.proc), q.ticket);
					RETURN -1;
				END IF;
			END IF;
			IF array_length(q.keys, 1) > 1 THEN
				passed := passed || q.ticket;
				passed_u := passed_u || q.units;
			END IF;
			i := i + 1;
		END IF;
	END LOOP;
END $$;
