-- Schema version 1, revision 25 (see migrate.go): serving reads less
-- under the key's lock.
--
-- Every call on a key waits for the key's lock, so on one busy key the
-- statements a call runs under it bound the key's admissions per second
-- (fleettest's LargeAmongSmall: 1,000 small requests behind one cap,
-- among heavy ones, on a machine whose processes share its cores with
-- the server). Serving read each waiter it looked at in a statement of
-- its own, then called inflight_dead on its process (a call and a
-- statement more); a serving that passes over waiters whose units do not
-- fit the key's room looks at up to PassScan of them, and the profile of
-- LargeAmongSmall counted about 15 looks per serving. And each serving,
-- and each look at another key's room (inflight_room), read the key's
-- leases twice: to delete the expired ones, then to count the units of
-- the others.
--
-- inflight_serve (resume.sql's, as revision 22 made it again) and
-- inflight_room (count.sql's) are made again, keeping their signatures
-- and the meaning of their answers:
--
--   - A waiter and its process's liveness are read in one statement (the
--     liveness is inflight_dead's expression, read with the waiter rather
--     than just after it, nothing written between).
--   - After a waiter passed over as heavy, serving reads the next waiters
--     in one query, in the queue's order, and passes over those it would
--     pass as heavy without a write (of one key, alive, its ticket
--     current, its units at most the limit and more than the room, not
--     passed its bound: it only notes the first as the blocker, counts
--     the look, and goes on), as many as its look bound lets; the first
--     other waiter is served as before, from the same read. No statement
--     of the call writes between the looks it replaces, and c, the key's
--     units, is the same for all of them. (A waiter whose units the room
--     does not fit is heavy before inflight_room_of is asked, which may
--     drop a dead urgent ticket: as before, it is not asked.) After any
--     other look, the next waiter is read alone, as before: a read of
--     the next ten (PL/pgSQL's FOR fetches them so) for one waiter made
--     BenchmarkDeepServe, whose waiters of several keys are passed over
--     one by one, a third slower.
--   - A key's units and whether one of its leases expired are counted in
--     one look at the leases; only if one expired are the expired ones
--     deleted and the units counted again (as before: delete, then
--     count). Without one, the count is the one the two statements made:
--     a write of a lease without the key's lock (a claim, a silence's
--     extension, inflight_heard) only puts its expiry later, which leaves
--     a lease not expired at now counted; inflight_gc deletes only leases
--     expired ten minutes before its clock, which the old count could
--     meet as well; and every other write of a key's leases holds its
--     lock.
--
-- inflight_dead's expression and inflight_units' are written out here,
-- in the reads they join: a revision that changes either must make these
-- two functions again too.

-- inflight_serve: see resume.sql; it reads less (above).
CREATE OR REPLACE FUNCTION inflight_serve(f text, k text, lim bigint, now bigint, claim bigint, start int) RETURNS int LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	i int := 0; -- the waiters passed over before q
	after inflight_ticket; -- the last of them this call looked at (NULL: none)
	mark text[]; -- where the look before stopped (inflight_looked)
	mark_max int := 0; -- its pmax: the most units of a waiter of several keys before it
	carried bool := false; -- the waiters before the mark, not urgent, are in passed
	steps int := 0;
	passed text[] := '{}'; -- the waiters of several keys passed over, not urgent yet
	passed_max int := 0; -- the most units of one of them, more than one and at most lim
	blocker inflight_ticket; -- the first heavy waiter it went past
	q inflight_ticket;
	qd record; -- the next waiter: q, whether its process is dead, whether it is passed over (below)
	q_dead bool; -- inflight_dead's answer for q's process
	found_q bool;
	heavy_last bool := false; -- the last waiter looked at was passed over as heavy
	expired bool; -- a lease of k had expired at now
	c bigint;
	ls bigint[];
	held bool;
	bound bool;
	busy bool;
	fits bool;
	u inflight_ticket; -- a busy key's oldest urgent ticket
	st int; -- inflight_take_stop's answer
BEGIN
	IF NOT EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k) THEN
		RETURN 0; -- nobody waits: the common case, at one probe's cost
	END IF;
	-- Once: no lease expires while the call runs (now is fixed), and only
	-- a grant changes k's leases meanwhile (inflight_drop and inflight_room
	-- take tickets out, not leases): a grant adds its units, unless its
	-- ticket holds a lease on k already (put back), which it keeps.
	SELECT coalesce(sum(x.units) FILTER (WHERE x.expires > now), 0), count(*) FILTER (WHERE x.expires <= now) > 0
		INTO c, expired FROM inflight_lease x WHERE x.fleet = f AND x.key = k;
	IF expired THEN
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires <= now;
		c := inflight_units(f, k, now);
	END IF;
	IF start > 0 THEN
		mark := inflight_looked(k);
		IF mark[2]::int IS DISTINCT FROM start + 1 THEN
			-- No mark of the look that answered start + 1 (a serving of k
			-- from the head since, which did not stop at its bound): it
			-- looks again from the head, as far as start + PassScan.
			mark := NULL;
			steps := -start;
		ELSE
			-- Going on past the look bound: the waiters of several keys
			-- before the mark are those the looks before passed (they
			-- would have stopped at one heavy, dropped one dead). One heavy
			-- now keeps the room (looked for only when the most units
			-- passed could be); its grants pass them (read at its first).
			mark_max := mark[6]::int;
			IF c < lim AND c + mark_max > lim AND inflight_heavy_before(f, k, lim, c, mark, now, claim) THEN
				RETURN -1;
			END IF;
			i := start;
		END IF;
	ELSIF current_setting('inflight.looked', true) <> '' THEN
		PERFORM inflight_look_to(k, 0, NULL, 0); -- a look from the head: k's mark goes
	END IF;
	LOOP
		IF c >= lim THEN
			RETURN 0;
		END IF;
		-- The next waiter by the queue's order: the first after the last
		-- passed over (those dropped or granted have left), or from the
		-- mark, or the head.
		-- A waiter of one key, alive, that k's room does not fit (c + its
		-- units > lim, at most lim) and that is not passed its bound is
		-- passed over as a heavy waiter (below): after one passed over as
		-- heavy, such waiters are passed in the one read that finds the
		-- next waiter to serve, as many as the look bound lets.
		found_q := false;
		IF after.ticket IS NOT NULL AND heavy_last THEN
			FOR qd IN SELECT x AS q, coalesce((SELECT y.alive_until <= now + 1.5 * claim FROM inflight_proc y
					WHERE y.fleet = f AND y.proc = x.proc), true) AS dead,
					array_length(x.keys, 1) = 1 AND x.units <= lim AND c + x.units > lim
						AND x.passed_units < {{passFactor}} * x.units AND x.expires > now AS heavy
				FROM inflight_ticket x WHERE x.fleet = f AND x.key = k
				AND (x.rank, x.tag, x.seq) > (after.rank, after.tag, after.seq)
				ORDER BY x.rank, x.tag, x.seq LOOP
				IF NOT qd.dead AND qd.heavy AND i < start + {{passScan}} AND steps < 4 * {{passScan}} THEN
					steps := steps + 1;
					IF blocker.ticket IS NULL THEN
						blocker := qd.q;
					END IF;
					i := i + 1;
					after := qd.q;
				ELSE
					found_q := true;
					EXIT;
				END IF;
			END LOOP;
		ELSIF after.ticket IS NOT NULL THEN
			SELECT x AS q, coalesce((SELECT y.alive_until <= now + 1.5 * claim FROM inflight_proc y
					WHERE y.fleet = f AND y.proc = x.proc), true) AS dead, NULL::bool AS heavy
				INTO qd FROM inflight_ticket x WHERE x.fleet = f AND x.key = k
				AND (x.rank, x.tag, x.seq) > (after.rank, after.tag, after.seq)
				ORDER BY x.rank, x.tag, x.seq LIMIT 1;
			found_q := FOUND;
		ELSIF mark IS NOT NULL THEN
			SELECT x AS q, coalesce((SELECT y.alive_until <= now + 1.5 * claim FROM inflight_proc y
					WHERE y.fleet = f AND y.proc = x.proc), true) AS dead, NULL::bool AS heavy
				INTO qd FROM inflight_ticket x WHERE x.fleet = f AND x.key = k
				AND (x.rank, x.tag, x.seq) >= (mark[3]::smallint, mark[4]::float8, mark[5]::bigint)
				ORDER BY x.rank, x.tag, x.seq LIMIT 1;
			found_q := FOUND;
		ELSE
			SELECT x AS q, coalesce((SELECT y.alive_until <= now + 1.5 * claim FROM inflight_proc y
					WHERE y.fleet = f AND y.proc = x.proc), true) AS dead, NULL::bool AS heavy
				INTO qd FROM inflight_ticket x WHERE x.fleet = f AND x.key = k
				ORDER BY x.rank, x.tag, x.seq LIMIT 1;
			found_q := FOUND;
		END IF;
		heavy_last := false;
		IF found_q THEN
			q := qd.q;
			q_dead := qd.dead;
		END IF;
		IF NOT found_q THEN
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
			PERFORM inflight_look_to(k, i + 1, q, greatest(passed_max, mark_max));
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
		IF q_dead OR q.expires <= now THEN
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
			after := q;
			heavy_last := true;
		ELSE
			st := 1; -- a waiter of several keys passes no heavy waiter
			IF blocker.ticket IS NULL OR array_length(q.keys, 1) = 1 THEN
				st := inflight_take_stop(f, k, q.keys, ls, q.ticket, q.arrival, q.units, now, claim, c);
			END IF;
			IF st = 0 THEN
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
				IF mark IS NOT NULL AND NOT carried THEN
					SELECT passed || coalesce(array_agg(x.ticket), '{}') INTO passed FROM inflight_ticket x
						WHERE x.fleet = f AND x.key = k AND x.passed < {{maxPassed}} AND array_length(x.keys, 1) > 1
							AND (x.rank, x.tag, x.seq) < (mark[3]::smallint, mark[4]::float8, mark[5]::bigint);
					carried := true;
				END IF;
				IF cardinality(passed) > 0 THEN
					-- At maxPassed grants passing it over, a ticket is
					-- urgent; passing it again changes nothing.
					WITH p AS (UPDATE inflight_ticket x SET passed = x.passed + 1, urgent = x.urgent OR x.passed + 1 >= {{maxPassed}}
							WHERE x.fleet = f AND x.key = k AND x.ticket = ANY (passed) RETURNING x.ticket, x.passed)
						SELECT coalesce(array_agg(p.ticket) FILTER (WHERE p.passed < {{maxPassed}}), '{}') INTO passed FROM p;
				END IF;
				-- The heavy waiter it went past has been passed its bound, or a
				-- waiter of several keys it passed is heavy now: serving stops
				-- there, as it would meeting it now.
				IF c < lim AND (bound OR c + passed_max > lim
						OR c + mark_max > lim AND inflight_heavy_before(f, k, lim, c, mark, now, claim)) THEN
					RETURN -1;
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
				-- over for, freed or not). Stopped at a key with no room, it
				-- keeps nothing.
				IF st < 0 AND q.units <= lim THEN
					-- Stopped at a busy key (the -st-th): those before it have
					-- room, as inflight_take_stop found.
					busy := false;
					fits := true;
					FOR j IN -st..array_length(q.keys, 1) LOOP
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
					IF q.units > 1 AND q.units <= lim THEN
						passed_max := greatest(passed_max, q.units);
					END IF;
				END IF;
				i := i + 1;
				after := q;
			END IF;
		END IF;
	END LOOP;
END $$;

-- inflight_room: see count.sql; the key's leases read once unless one
-- expired (above).
CREATE OR REPLACE FUNCTION inflight_room(f text, k text, lim bigint, t text, arrival bigint, now bigint, claim bigint) RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	c bigint;
	expired bool;
BEGIN
	SELECT coalesce(sum(x.units) FILTER (WHERE x.expires > now), 0), count(*) FILTER (WHERE x.expires <= now) > 0
		INTO c, expired FROM inflight_lease x WHERE x.fleet = f AND x.key = k;
	IF expired THEN
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires <= now; -- expired
		c := inflight_units(f, k, now);
	END IF;
	RETURN inflight_room_of(f, k, lim, t, arrival, now, claim, c);
END $$;
