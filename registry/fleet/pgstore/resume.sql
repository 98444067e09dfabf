-- Schema version 1, revision 21 (see migrate.go): a serving that goes on
-- past its look bound goes on from the waiter the look before it did not
-- reach, wherever it stands now.
--
-- Revision 19's serving went on from the index where the one before it
-- stopped (start). But between the two, another key's serving in the same
-- call may grant a waiter before that index (one of several keys, held up
-- on the other key until then), and every waiter behind it slides one
-- place forward: the first the look before did not reach stood before
-- start then, and was skipped (fleettest's LightWaiterSlidBeforeTheLookBound:
-- a light waiter skipped, and a newcomer took its room). Its grants also
-- did not pass the waiters of several keys before start (towards
-- registry.MaxPassed: fleettest's UrgentPastTheLookBound). Now a serving
-- that stops at its look bound marks the first waiter it did not reach
-- (its place in the queue's order, in a setting local to the transaction,
-- inflight.looked), and one with start > 0 goes on from that place, the
-- waiters of several keys before it counted as passed, as Redis's scripts
-- carry them (lookedTo, passedBy); with no mark of that look (a serving
-- of the key from the head took it away since), it looks again from the
-- head, as far. Serving steps through the queue by its
-- order from the last waiter passed over, not by OFFSET (a look at the
-- i-th waiter read i index entries), and counts a grant's passes in one
-- statement, forgetting a ticket once urgent (a pass more changes
-- nothing), so a release of many pairs on a key looks at each waiter
-- about once. A waiter of several keys passed over is looked at again
-- (busykey.sql) only if a busy key stopped it. It keeps its signature and
-- the meaning of its answers.

-- A key's oldest urgent ticket (inflight_room_of's look, at each waiter
-- a serving looks at) is found through an index of the urgent tickets:
-- without it, each look read the key's whole queue, and a release of many
-- pairs on a long queue read it once per waiter it looked at.
CREATE INDEX IF NOT EXISTS inflight_ticket_urgent ON inflight_ticket (fleet, key, arrival) WHERE urgent;

-- inflight_take_stop is inflight_can_take that says where it stopped: 0
-- if t can take room for its units on all of keys, else the index of the
-- first key that stopped it, negative if another call holds that key
-- (not locked, it was not looked at; the keys before it have room).
CREATE OR REPLACE FUNCTION inflight_take_stop(f text, k text, keys text[], limits bigint[], t text, arrival bigint, units int,
	now bigint, claim bigint, c bigint) RETURNS int LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	FOR i IN 1..array_length(keys, 1) LOOP
		IF keys[i] <> k AND NOT inflight_trylock(f, keys[i]) THEN
			RETURN -i;
		END IF;
		IF keys[i] = k THEN
			IF inflight_room_of(f, k, limits[i], t, arrival, now, claim, c) < units THEN
				RETURN i;
			END IF;
		ELSIF inflight_room(f, keys[i], limits[i], t, arrival, now, claim) < units
				OR inflight_behind_heavy(f, keys[i], t, now) THEN
			RETURN i;
		END IF;
	END LOOP;
	RETURN 0;
END $$;

-- inflight_can_take: see count.sql; inflight_take_stop's answer 0.
CREATE OR REPLACE FUNCTION inflight_can_take(f text, k text, keys text[], limits bigint[], t text, arrival bigint, units int,
	now bigint, claim bigint, c bigint) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
	RETURN inflight_take_stop(f, k, keys, limits, t, arrival, units, now, claim, c) = 0;
END $$;

-- inflight_looked returns the mark that k's last serving in this
-- transaction left where it stopped at its look bound (see above): its
-- answer, and the place (rank, tag, seq) of the first waiter it did not
-- reach; NULL if none. The setting holds one entry per key, named by the
-- key's md5.
CREATE OR REPLACE FUNCTION inflight_looked(k text) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
	e text;
BEGIN
	SELECT x INTO e FROM unnest(string_to_array(current_setting('inflight.looked', true), ',')) x
		WHERE left(x, 32) = md5(k) LIMIT 1;
	RETURN string_to_array(e, ':');
END $$;

-- inflight_look_to marks q, the first waiter of k that a serving
-- answering r did not reach (inflight_looked), with pmax, the most units
-- of a waiter of several keys that the looks from the head passed (more
-- than one, at most the limit); with r 0, it takes k's mark away. Its tag
-- is written as the float it is (any extra_float_digits above 0 writes
-- the shortest text that reads back the same from PostgreSQL 12 on; 3,
-- 17 digits, before it).
CREATE OR REPLACE FUNCTION inflight_look_to(k text, r int, q inflight_ticket, pmax int) RETURNS void LANGUAGE plpgsql
	SET extra_float_digits = 3 AS $$
BEGIN
	PERFORM set_config('inflight.looked', coalesce(concat_ws(',', (SELECT string_agg(x, ',')
			FROM unnest(string_to_array(current_setting('inflight.looked', true), ',')) x WHERE left(x, 32) <> md5(k)),
		CASE WHEN r > 0 THEN concat_ws(':', md5(k), r, q.rank, q.tag, q.seq, pmax) END), ''), true);
END $$;

-- inflight_heavy_before reports whether a waiter of several keys before
-- mark in k's queue (of a live process, its ticket current) has no room
-- for its units, at most lim, at c: heavy, it keeps the room.
CREATE OR REPLACE FUNCTION inflight_heavy_before(f text, k text, lim bigint, c bigint, mark text[], now bigint, claim bigint)
	RETURNS bool LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	RETURN EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k
		AND (x.rank, x.tag, x.seq) < (mark[3]::smallint, mark[4]::float8, mark[5]::bigint)
		AND x.units > 1 AND x.units <= lim AND c + x.units > lim AND array_length(x.keys, 1) > 1 AND x.expires > now
		AND NOT inflight_dead(f, x.proc, now, claim));
END $$;

-- inflight_serve: see busykey.sql; from start > 0, it goes on from the
-- waiter its look before did not reach (above).
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
	DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires <= now; -- expired
	c := inflight_units(f, k, now);
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
		IF after.ticket IS NOT NULL THEN
			SELECT * INTO q FROM inflight_ticket x WHERE x.fleet = f AND x.key = k
				AND (x.rank, x.tag, x.seq) > (after.rank, after.tag, after.seq)
				ORDER BY x.rank, x.tag, x.seq LIMIT 1;
		ELSIF mark IS NOT NULL THEN
			SELECT * INTO q FROM inflight_ticket x WHERE x.fleet = f AND x.key = k
				AND (x.rank, x.tag, x.seq) >= (mark[3]::smallint, mark[4]::float8, mark[5]::bigint)
				ORDER BY x.rank, x.tag, x.seq LIMIT 1;
		ELSE
			SELECT * INTO q FROM inflight_ticket x WHERE x.fleet = f AND x.key = k
				ORDER BY x.rank, x.tag, x.seq LIMIT 1;
		END IF;
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
			after := q;
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
