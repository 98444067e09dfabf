-- Schema version 1, revision 6 (see migrate.go): lighter waiters pass a
-- heavy one, up to a bound.
--
-- Before it, serving stopped at a heavy waiter (one whose units find no
-- room on the key): the units free beside it stood idle until enough were
-- freed for it. Now a heavy waiter of one key lets waiters of one key
-- behind it, and newcomers of one key that wait, take the room until the
-- units granted past it count PassFactor times its own (driver.Pass: a
-- waiter of another flow or class counts 2*PassFactor times its
-- units), looking at most {{passScan}} waiters from where serving starts;
-- then serving stops there, as before (driver.ReleaseCall). A waiter of
-- several keys passes none, and a heavy waiter of several keys is passed
-- by none.
--
-- It adds inflight_ticket.passed_units (not indexed: its updates stay
-- HOT), replaces inflight_serve and inflight_still_queued with the same
-- signatures and answers, and
-- adds inflight_admit_passing, which calls inflight_admit and counts what
-- a newcomer takes past a heavy waiter. A process of an earlier release
-- calls inflight_serve too, so its waiters pass alike from the migration
-- on; its newcomers pass none.

ALTER TABLE inflight_ticket ADD COLUMN IF NOT EXISTS passed_units bigint NOT NULL DEFAULT 0;

-- inflight_pass counts units of a waiter of flow fl and rank r, granted
-- on k past heavy waiter b (driver.Pass).
CREATE OR REPLACE FUNCTION inflight_pass(f text, k text, b inflight_ticket, fl text, r smallint, units int)
	RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	UPDATE inflight_ticket x SET passed_units = x.passed_units
		+ CASE WHEN x.flow = fl AND x.rank = r THEN units ELSE 2 * {{passFactor}} * units END
		WHERE x.fleet = f AND x.key = k AND x.ticket = b.ticket;
END $$;

-- inflight_serve (replaced by serve.sql, revision 8, which counts the
-- key's units less often) grants k's waiters in order, from the one at index
-- from (0: the head), while k has room under lim: each that can take room
-- for its units on all of its keys; a waiter of a dead process is
-- dropped. It goes past a heavy waiter of one key, one whose units, at
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
	LOOP
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires <= now; -- expired
		c := inflight_units(f, k, now);
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

-- inflight_admit_passing (replaced by newcomer.sql, revision 10, which
-- counts a call whose lease has expired as a newcomer) is the admission
-- call (fleet.AdmitCall), as inflight_admit makes it, and for a newcomer
-- of one key that waits and is admitted beside a heavy waiter (serving
-- went past it), counts its units
-- against the first such waiter (inflight_pass). Only such a call sets
-- inflight.pass on for its transaction: in any other (a call that does
-- not wait or is of several keys, or a release's, or inflight_admit
-- called by a process of an earlier release), serving answers as if it
-- stopped there, so its newcomer does not pass.
CREATE OR REPLACE FUNCTION inflight_admit_passing(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint, known bigint,
	pause bigint, wait bool, starts bool, claim bigint, r smallint, fl text, weight int, p text, max_q int, max_f int,
	live bigint, async bool, carried_keys text[], carried_leases text[], units int, carried_units int[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	res bigint[];
	newcomer bool := false;
	b inflight_ticket;
BEGIN
	-- Only a key with a weighted waiter (one probe of their index) may
	-- have a heavy waiter to pass: elsewhere the call is inflight_admit's.
	-- One that comes meanwhile keeps the room from this call, as a
	-- process of an earlier release's.
	IF wait AND array_length(keys, 1) = 1
		AND EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[1] AND x.units > 1) THEN
		newcomer := NOT EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[1] AND x.ticket = l)
			AND NOT EXISTS (SELECT 1 FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[1] AND x.lease = l);
		PERFORM set_config('inflight.pass', 'on', true);
	END IF;
	res := inflight_admit(f, l, keys, limits, ttl, not_after, known, pause, wait, starts, claim, r, fl, weight, p,
		max_q, max_f, live, async, carried_keys, carried_leases, units, carried_units);
	IF res[1] = 1 AND newcomer THEN
		-- Under the key's lock (inflight_admit took it): the first
		-- heavy waiter of one key still queued is one it went past.
		SELECT * INTO b FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[1] AND x.units > 1
			AND x.units <= limits[1] AND array_length(x.keys, 1) = 1 ORDER BY x.rank, x.tag, x.seq LIMIT 1;
		IF FOUND THEN
			PERFORM inflight_pass(f, keys[1], b, fl, r, greatest(coalesce(units, 1), 1));
		END IF;
	END IF;
	RETURN res;
END $$;

-- (Replaced by silence.sql, revision 12: it writes heard.)
-- inflight_still_queued answers a queued waiter's ask without the keys'
-- locks, as revision 3 made it, where the head of a key it fits keeps the
-- room; a head that a waiter of one key may still pass (it is of one key
-- and under its bound) does not: the whole path decides then.
CREATE OR REPLACE FUNCTION inflight_still_queued(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint,
	known bigint, pause bigint, p text, live bigint) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	n int := array_length(keys, 1);
	now bigint := inflight_now_us() / 1000;
	places int;
	u int;
	c bigint;
	h inflight_ticket;
BEGIN
	IF known <= 0 OR not_after > 0 AND now > not_after THEN
		RETURN NULL;
	END IF;
	IF NOT inflight_current(f, known, pause, ttl, now) THEN
		RETURN NULL;
	END IF;
	SELECT count(*), max(x.units) INTO places, u FROM inflight_ticket x WHERE x.fleet = f AND x.key = ANY (keys) AND x.ticket = l;
	IF places <> n
		OR EXISTS (SELECT 1 FROM inflight_lease x WHERE x.fleet = f AND x.key = ANY (keys) AND x.lease = l)
		OR inflight_abandoned(f, l, now)
		OR NOT EXISTS (SELECT 1 FROM inflight_proc x WHERE x.fleet = f AND x.proc = p AND x.alive_until > now) THEN
		RETURN NULL;
	END IF;
	FOR i IN 1..n LOOP
		c := inflight_units(f, keys[i], now);
		IF c + u <= limits[i] THEN
			SELECT * INTO h FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[i] ORDER BY x.rank, x.tag, x.seq LIMIT 1;
			IF NOT FOUND OR h.units > limits[i] OR c + h.units <= limits[i] OR h.expires <= now
				OR n = 1 AND array_length(h.keys, 1) = 1 AND h.passed_units < {{passFactor}} * h.units
				OR NOT EXISTS (SELECT 1 FROM inflight_proc x WHERE x.fleet = f AND x.proc = h.proc AND x.alive_until > now + live / 2) THEN
				RETURN NULL;
			END IF;
		END IF;
	END LOOP;
	UPDATE inflight_ticket x SET expires = now + 3 * ttl, limits = inflight_still_queued.limits
		WHERE (x.fleet, x.key, x.ticket) IN (SELECT y.fleet, y.key, y.ticket FROM inflight_ticket y
			WHERE y.fleet = f AND y.key = ANY (keys) AND y.ticket = l FOR UPDATE SKIP LOCKED);
	UPDATE inflight_proc x SET alive_until = greatest(x.alive_until, now + live)
		WHERE (x.fleet, x.proc) IN (SELECT y.fleet, y.proc FROM inflight_proc y WHERE y.fleet = f AND y.proc = p FOR UPDATE SKIP LOCKED);
	RETURN ARRAY[3, 1, inflight_units(f, keys[1], now), inflight_earliest(f, keys[1], now), now, known, inflight_queued(f, keys[1], now)];
END $$;
