-- Schema version 1, revision 8 (see migrate.go): serving counts a key's
-- units once, and again after each grant.
--
-- inflight_serve used to delete a key's expired leases and sum its units
-- at every waiter it looked at: with a few hundred leases on a key and a
-- queue behind heavy waiters, most of a call's time, under the key's lock
-- (17,174 sums in 1,040 calls of one run of fleettest.Bench's
-- LargeAmongSmall). Its answers are the same; its signature too, so a
-- process of an earlier release calls this one.

-- inflight_serve (replaced by count.sql, revision 9, which carries the
-- count from grant to grant) grants k's waiters in order, from the one at
-- index from (0: the head), while k has room under lim: each that can
-- take room for its units on all of its keys; a waiter of a dead process
-- is dropped. It goes past a heavy waiter of one key, one whose units, at
-- most lim, find no room on k under lim, up to its bound (see above and
-- driver.ReleaseCall), and stops at any other, returning -1: nobody
-- behind it, nor a newcomer, takes k's room. A waiter passed over for
-- want of room on another key (or under its own limit on k, below lim),
-- or whose units are over lim (a limit lowered under it: its process
-- refuses it), is passed over. If it stops at its bound on the waiters it
-- looks at, it returns -1 if it went past a heavy waiter, else, with room
-- left and waiters further back, one more than the index of the first of
-- those; else 0, or -1 if it went past a heavy waiter in a call whose
-- newcomer may not pass one (inflight.pass not on: see below).
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
BEGIN
	IF NOT EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k) THEN
		RETURN 0; -- nobody waits: the common case, at one probe's cost
	END IF;
	-- Once: no lease expires while the call runs (now is fixed), and only
	-- a grant changes k's leases meanwhile (inflight_drop and inflight_room
	-- take tickets out, not leases), so the count is read again after one.
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
				OR q.units > 1 AND inflight_room(f, k, lim, q.ticket, q.arrival, now, claim) < q.units) THEN
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
				AND inflight_can_take(f, k, q.keys, ls, q.ticket, q.arrival, q.units, now, claim) THEN
			PERFORM inflight_grant(f, q.keys, q.ticket, q.proc, now, claim, q.units);
			c := inflight_units(f, k, now);
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
