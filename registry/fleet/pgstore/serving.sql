-- Schema version 1, revision 17 (see migrate.go): serving stops where a
-- waiter it went past needs the room, and a lease leaves every key before
-- any is served.
--
-- inflight_serve went on granting past a heavy waiter of one key once the
-- units granted past it in the same serving reached its bound (it checked
-- the bound only when it met the waiter), and past a waiter of several
-- keys it had passed over for want of room on another key once the grants
-- behind it left too little room on this one for its units: it stops
-- there now, as it would meeting either then (driver.ReleaseCall), and
-- returns -1 (a serving that goes on from where one stopped at its look
-- bound, start > 0, does not know the waiters of several keys before
-- start: memstore's, which looks again from the head after each grant,
-- does). inflight_admit counted the keys its lease holds while it served
-- them, so that a grant its own call made on all of its keys while serving
-- a later one was counted on that key only, given back and queued again:
-- it counts once every key is served. inflight_abandon served each
-- key as soon as the lease left it, before it left the next: a waiter of
-- several keys found no room on those and was passed over; it takes the
-- lease off every key first. All three keep their signatures and the
-- meaning of their answers, as on Redis and in memstore.

-- inflight_serve: see serve.sql and count.sql; it stops, too, at a heavy
-- waiter it went past once it has been passed its bound, and at a
-- waiter of several keys it passed once it is heavy (above).
CREATE OR REPLACE FUNCTION inflight_serve(f text, k text, lim bigint, now bigint, claim bigint, start int) RETURNS int LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	i int := start;
	steps int := 0;
	passed text[] := '{}';
	passed_u int[] := '{}'; -- the units of each of passed
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

-- inflight_admit: see pausedask.sql; the keys its lease holds are
-- counted once every key is served (above).
CREATE OR REPLACE FUNCTION inflight_admit(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint, known bigint,
	pause bigint, wait bool, starts bool, claim bigint, r smallint, fl text, weight int, p text, max_q int, max_f int,
	live bigint, async bool, carried_keys text[], carried_leases text[], units int, carried_units int[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	n int := array_length(keys, 1);
	u int := greatest(coalesce(units, 1), 1);
	now bigint;
	now_us bigint;
	ep bigint;
	paused bigint;
	stopped bool;
	held int := 0;
	cut int := 0;
	kept bool := false;
	fk int := 0;
	queued bool[] := '{}';
	any_queued bool;
	stop_at int[] := '{}';
	again int;
	given_back bool := false;
	room bigint;
	w int;
	qn int;
	fq int;
	res bigint[];
	mine inflight_ticket;
	places int;
BEGIN
	PERFORM inflight_begin(async);
	IF wait AND coalesce(array_length(carried_keys, 1), 0) = 0 THEN
		res := inflight_still_queued(f, l, keys, limits, ttl, not_after, known, pause, p, live);
		IF res IS NOT NULL THEN
			RETURN res;
		END IF;
	END IF;
	PERFORM inflight_lock(f, keys || coalesce(carried_keys, '{}'));
	now_us := inflight_now_us();
	now := now_us / 1000;
	IF not_after > 0 AND now > not_after THEN
		RETURN ARRAY[-2, 0, 0, 0, now, 0, 0];
	END IF;
	SELECT * INTO ep, paused FROM inflight_epoch(f, now, now_us, known, pause, ttl);
	FOR j IN 1..coalesce(array_length(carried_keys, 1), 0) LOOP
		IF NOT inflight_abandoned(f, carried_leases[j], now) THEN
			-- Put back weighing its units; a pair there already keeps its own.
			INSERT INTO inflight_lease AS x (fleet, key, lease, expires, units)
				VALUES (f, carried_keys[j], carried_leases[j], now + ttl, greatest(coalesce(carried_units[j], 1), 1))
				ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = greatest(x.expires, EXCLUDED.expires), graced = false;
		END IF;
	END LOOP;
	IF inflight_abandoned(f, l, now) THEN
		RETURN ARRAY[-1, 0, 0, 0, now, ep, 0];
	END IF;
	stopped := paused > now AND EXISTS (SELECT 1 FROM unnest(limits) x WHERE x < 9000000000000000000);
	FOR i IN 1..n LOOP
		queued[i] := EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[i]);
	END LOOP;
	any_queued := true = ANY (queued);
	IF any_queued THEN
		-- Queued: its keys' limits as the caller has them now, before serving.
		UPDATE inflight_ticket x SET limits = inflight_admit.limits WHERE x.fleet = f AND x.key = ANY (keys) AND x.ticket = l;
	END IF;
	-- stop_at[i] is how serving keys[i] ended (see inflight_serve): > 0 at
	-- its bound on the waiters it looks at, -1 at a heavy waiter, who keeps
	-- the key's room.
	FOR i IN 1..n LOOP
		stop_at[i] := 0;
		IF queued[i] AND NOT stopped THEN
			stop_at[i] := inflight_serve(f, keys[i], limits[i], now, claim, 0);
		END IF;
	END LOOP;
	-- Counted once every key is served: serving a later key may grant the
	-- ticket on all of its keys, those served before too.
	FOR i IN 1..n LOOP
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.expires <= now; -- expired
		IF EXISTS (SELECT 1 FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.lease = l) THEN
			held := held + 1;
		END IF;
	END LOOP;
	-- A grant made under a limit that has dropped since is given back, and
	-- its room served; its waiter queues again, past the bounds.
	IF held = n THEN
		FOR i IN 1..n LOOP
			IF inflight_units(f, keys[i], now) > limits[i] THEN
				given_back := true;
			END IF;
		END LOOP;
		IF NOT given_back THEN
			UPDATE inflight_lease x SET expires = greatest(x.expires, now + ttl), granted = false, graced = false
				WHERE x.fleet = f AND x.key = ANY (keys) AND x.lease = l;
			RETURN inflight_admitted(f, keys, n, starts, now, now_us, ep, not_after);
		END IF;
	END IF;
	IF held > 0 THEN
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = ANY (keys) AND x.lease = l;
		FOR i IN 1..n LOOP
			IF queued[i] AND NOT stopped THEN
				-- Whether a heavy waiter keeps the key's room is as this
				-- serving found it.
				again := inflight_serve(f, keys[i], limits[i], now, claim, 0);
				IF again < 0 OR stop_at[i] < 0 THEN
					stop_at[i] := again;
				END IF;
			END IF;
		END LOOP;
	END IF;
	FOR i IN 1..n LOOP
		IF stop_at[i] > 0 AND cut = 0 THEN
			cut := i;
		END IF;
		kept := kept OR stop_at[i] < 0;
	END LOOP;
	IF stopped THEN
		-- A queued ticket's process stays alive, and its place kept, while
		-- admissions are paused: its place outlasts the pause.
		IF queued[1] AND EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[1] AND x.ticket = l) THEN
			PERFORM inflight_alive(f, p, now, live);
			UPDATE inflight_ticket x SET expires = now + 3 * ttl WHERE x.fleet = f AND x.key = ANY (keys) AND x.ticket = l;
		END IF;
		RETURN ARRAY[2, 0, inflight_units(f, keys[1], now), paused, now, ep, 0];
	END IF;
	places := 0; -- a ticket is queued on keys that have a queue
	IF any_queued THEN
		SELECT * INTO mine FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[1] AND x.ticket = l;
		places := (SELECT count(*) FROM inflight_ticket x WHERE x.fleet = f AND x.key = ANY (keys) AND x.ticket = l);
	END IF;
	IF places > 0 AND places < n THEN
		-- Dropped from some of its keys (a busy key kept it): it queues
		-- again, as a newcomer.
		FOR i IN 1..n LOOP
			PERFORM inflight_unqueue(f, keys[i], l, true);
		END LOOP;
	END IF;
	IF queued[1] AND places = n THEN
		PERFORM inflight_alive(f, p, now, live);
		UPDATE inflight_ticket x SET expires = now + 3 * ttl WHERE x.fleet = f AND x.key = ANY (keys) AND x.ticket = l;
		-- Serving stopped short of it at its bound, and at no heavy waiter:
		-- it takes the room if it can (and no heavy waiter stands before it
		-- on any of its keys, keys[1]'s beyond the bound included).
		IF cut > 0 AND NOT kept AND NOT inflight_behind_heavy(f, keys[1], l, now)
			AND inflight_can_take(f, keys[1], keys, limits, l, mine.arrival, mine.units, now, claim) THEN
			FOR i IN 1..n LOOP
				PERFORM inflight_unqueue(f, keys[i], l, false);
			END LOOP;
			INSERT INTO inflight_lease AS x (fleet, key, lease, expires, units) SELECT f, k, l, now + ttl, mine.units FROM unnest(keys) k
				ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = greatest(x.expires, EXCLUDED.expires), graced = false;
			RETURN inflight_admitted(f, keys, n, starts, now, now_us, ep, not_after);
		END IF;
		-- It names the first of its keys without room for its units, or
		-- kept for a heavy waiter (the first if none).
		w := 1;
		FOR i IN 1..n LOOP
			IF stop_at[i] < 0 OR inflight_units(f, keys[i], now) + mine.units > limits[i] THEN
				w := i;
				EXIT;
			END IF;
		END LOOP;
		RETURN ARRAY[3, w, inflight_units(f, keys[w], now), inflight_earliest(f, keys[w], now), now, ep, inflight_queued(f, keys[w], now)];
	END IF;
	-- A newcomer: where serving stopped short, it looks further (and a
	-- heavy waiter found there keeps the room); it takes the room only if
	-- no waiter that it has looked at can, and no heavy waiter keeps it.
	FOR i IN 1..n LOOP
		IF stop_at[i] > 0 AND inflight_serve(f, keys[i], limits[i], now, claim, stop_at[i] - 1) <> 0 THEN
			fk := i;
			EXIT;
		END IF;
	END LOOP;
	IF fk = 0 THEN
		FOR i IN 1..n LOOP
			IF stop_at[i] < 0 THEN
				fk := i;
				EXIT;
			END IF;
			IF queued[i] THEN
				room := inflight_room(f, keys[i], limits[i], NULL, NULL, now, claim);
			ELSE
				room := limits[i] - inflight_units(f, keys[i], now);
			END IF;
			IF room < u THEN
				fk := i;
				EXIT;
			END IF;
		END LOOP;
	END IF;
	IF fk = 0 THEN
		INSERT INTO inflight_lease AS x (fleet, key, lease, expires, units) SELECT f, k, l, now + ttl, u FROM unnest(keys) k
			ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = greatest(x.expires, EXCLUDED.expires), units = EXCLUDED.units,
				graced = false;
		RETURN inflight_admitted(f, keys, n, starts, now, now_us, ep, not_after);
	END IF;
	qn := inflight_queued(f, keys[fk], now);
	IF NOT wait THEN
		RETURN ARRAY[0, fk, inflight_units(f, keys[fk], now), inflight_earliest(f, keys[fk], now), now, ep, qn];
	END IF;
	IF NOT given_back THEN
		FOR i IN 1..n LOOP
			qn := inflight_queued(f, keys[i], now);
			IF max_q >= 0 AND qn >= max_q THEN
				RETURN ARRAY[4, i, inflight_units(f, keys[i], now), inflight_earliest(f, keys[i], now), now, ep, qn];
			END IF;
			SELECT coalesce(sum(x.n), 0) INTO fq FROM inflight_flow x WHERE x.fleet = f AND x.key = keys[i] AND x.flow = fl;
			IF max_f >= 0 AND fq >= max_f THEN
				RETURN ARRAY[5, i, inflight_units(f, keys[i], now), inflight_earliest(f, keys[i], now), now, ep, fq];
			END IF;
		END LOOP;
	END IF;
	qn := inflight_queued(f, keys[fk], now);
	PERFORM inflight_enqueue(f, keys, limits, l, r, fl, weight, p, now, ttl, u);
	PERFORM inflight_alive(f, p, now, live);
	PERFORM inflight_in_time(not_after);
	RETURN ARRAY[3, fk, inflight_units(f, keys[fk], now), inflight_earliest(f, keys[fk], now), now, ep, qn + 1];
END $$;

-- inflight_abandon: see silence.sql; its keys are served once the
-- lease is gone from all of them (above).
CREATE OR REPLACE FUNCTION inflight_abandon(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint, claim bigint, async bool)
	RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now bigint;
	serving bool;
	stay bigint := ttl;
BEGIN
	SELECT * INTO now, serving FROM inflight_freeing(f, keys, async, ttl);
	FOR i IN 1..coalesce(array_length(keys, 1), 0) LOOP
		PERFORM inflight_unqueue(f, keys[i], l, true);
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.lease = l;
	END LOOP;
	-- Served once the lease is gone from every key: a waiter of several of
	-- them needs its room on each.
	FOR i IN 1..coalesce(array_length(keys, 1), 0) LOOP
		IF serving AND limits IS NOT NULL AND i <= coalesce(array_length(limits, 1), 0) THEN
			PERFORM inflight_serve(f, keys[i], limits[i], now, claim, 0);
		END IF;
	END LOOP;
	IF not_after > 0 THEN
		stay := greatest(stay, not_after - now + 1);
	END IF;
	INSERT INTO inflight_tomb AS x (fleet, lease, until) VALUES (f, l, now + stay)
		ON CONFLICT (fleet, lease) DO UPDATE SET until = greatest(x.until, EXCLUDED.until);
END $$;
