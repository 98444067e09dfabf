-- Schema version 1, revision 26 (see migrate.go): an admission reads a
-- busy key's leases fewer times.
--
-- A key's leases have no index but the primary key, so every count of
-- its units, every look for its earliest expiry and every delete of its
-- expired leases reads all of them: on a key held by many leases
-- (fleettest's LargeAmongSmall: up to a thousand small requests in
-- flight behind one cap), these reads are most of what PostgreSQL does
-- for a call under the key's lock. Revision 25 (servereads.sql) read
-- them once per serving; an admission and a queued waiter's ask still
-- read them more often than they need.
--
-- inflight_admit (queuedkey.sql's) and inflight_still_queued
-- (queuedkey.sql's, as revision 22 made it again) are made again,
-- keeping their signatures and the meaning of their answers:
--
--   - inflight_admit deleted each key's expired leases after serving it,
--     though serving (inflight_serve) deletes them at the same now on a
--     key that has a ticket. It deletes them now only on a key it did not
--     serve, or whose serving found no ticket there (its first probe): a
--     key it serves first still has the ticket it found, as nothing in
--     between takes one out; a later key's is probed again before its
--     serving, since the serving of a key before it may have granted or
--     dropped that key's last ticket. Other calls do not take a ticket
--     off a key without its lock, which this call holds. Once serving
--     has deleted them no lease of the key is expired at now: the
--     serving of another key adds a grant expiring at now + claim, and
--     the writes made without the key's lock (a claim, a silence's
--     extension) only put an expiry later. With claim 0 or less a grant
--     is expired when it is made, and the delete is made as before.
--   - A reply that names a key (queued, refused, not waiting) read its
--     units and its earliest expiry in two looks at its leases. They are
--     read in one (the same rows: those not expired at now), and where
--     the call had just counted that key's units, to find the key it
--     names, that look reads the earliest expiry too and the reply uses
--     it: inflight_admit's look is under the key's lock, after its
--     expired leases are gone, and nothing the call does between writes
--     a lease; inflight_still_queued's, without the lock, is of the same
--     call, as its reply's was, an instant before.
--
-- inflight_units' and inflight_earliest's condition (a lease not expired
-- at now) is written out in the reads that count a key's units and find
-- its earliest expiry at once: a revision that changes either function
-- must make these two again too.
--
-- inflight_claim (silence.sql's) is left as it is. Its block with an
-- exception handler is a subtransaction per claim, and it is what lets
-- the lease's rows go when a check made after locking them fails, before
-- the whole path locks the keys (a call that holds a key may be waiting
-- for those rows: see asks.sql). Checking first without the rows' locks,
-- then locking them with SKIP LOCKED, leaves a row locked where the check
-- made again under the lock fails, or where one of several rows is locked
-- and another is not; and a claim with the block and one without it
-- took the same time, within the noise, on a key of 500 leases (about
-- 440 us a call over a connection, 170 us of it the count of the key's
-- units).

-- inflight_admit: see queuedkey.sql; it leaves a key's expired leases to
-- its serving, and reads a reply's count and earliest expiry at once
-- (above).
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
	swept bool[] := '{}'; -- serving keys[i] deleted its expired leases at now
	passing bool := false; -- inflight.pass set on by this call (above)
	was_pass text;
	again int;
	given_back bool := false;
	room bigint;
	w int;
	qn int;
	fq int;
	res bigint[];
	mine inflight_ticket;
	places int;
	c bigint; -- a key's units at now
	e bigint; -- its earliest expiry after now (0: none)
	c1 bigint; -- keys[1]'s
	e1 bigint;
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
	-- A ticket queued on every key is no newcomer: a serving that went past
	-- a heavy waiter to the end of a key's queue, without stopping there,
	-- keeps nothing from it (as inflight_admit_passing has it for a call on
	-- one key), and it names a key so kept only where serving stopped.
	IF any_queued AND (SELECT count(*) FROM inflight_ticket x WHERE x.fleet = f AND x.key = ANY (keys) AND x.ticket = l) = n THEN
		was_pass := coalesce(current_setting('inflight.pass', true), '');
		IF was_pass IS DISTINCT FROM 'on' THEN
			passing := true;
			PERFORM set_config('inflight.pass', 'on', true);
		END IF;
	END IF;
	-- stop_at[i] is how serving keys[i] ended (see inflight_serve): > 0 at
	-- its bound on the waiters it looks at, -1 at a heavy waiter, who keeps
	-- the key's room.
	FOR i IN 1..n LOOP
		stop_at[i] := 0;
		swept[i] := false;
		IF queued[i] AND NOT stopped THEN
			-- Serving a key that has a ticket deletes its expired leases
			-- (past its first probe): keys[1] had one above, and nothing
			-- since took it out; a later key's may have left, granted or
			-- dropped by the serving of a key before it.
			swept[i] := i = 1 OR EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[i]);
			stop_at[i] := inflight_serve(f, keys[i], limits[i], now, claim, 0);
		END IF;
	END LOOP;
	-- Counted once every key is served: serving a later key may grant the
	-- ticket on all of its keys, those served before too. A key swept
	-- has no lease expired at now left: the grants made since expire at
	-- now + claim.
	FOR i IN 1..n LOOP
		IF NOT swept[i] OR claim <= 0 THEN
			DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.expires <= now; -- expired
		END IF;
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
		-- Each key's units and earliest expiry are read at once, and the
		-- reply has the named key's.
		w := 1;
		FOR i IN 1..n LOOP
			SELECT coalesce(sum(x.units), 0), coalesce(min(x.expires), 0) INTO c, e
				FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.expires > now;
			IF i = 1 THEN
				c1 := c;
				e1 := e;
			END IF;
			IF stop_at[i] < 0 OR c + mine.units > limits[i] THEN
				w := i;
				EXIT;
			END IF;
		END LOOP;
		IF w = 1 THEN
			c := c1;
			e := e1;
		END IF;
		RETURN ARRAY[3, w, c, e, now, ep, inflight_queued(f, keys[w], now)];
	END IF;
	-- Queued on every key when its call began, it is not now (its own
	-- serving dropped its ticket, its process found dead or its ticket
	-- expired, or granted it a grant given back): a newcomer, which a key
	-- whose serving went past a heavy waiter keeps out (unless of one key
	-- and passing, as the call had inflight.pass). Serving with inflight.pass
	-- on did not tell those keys: their queues are served again as the
	-- newcomer's, with the setting as it was.
	IF passing THEN
		PERFORM set_config('inflight.pass', was_pass, true);
		FOR i IN 1..n LOOP
			IF queued[i] AND stop_at[i] >= 0 THEN
				stop_at[i] := inflight_serve(f, keys[i], limits[i], now, claim, 0);
			END IF;
		END LOOP;
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
		SELECT coalesce(sum(x.units), 0), coalesce(min(x.expires), 0) INTO c, e
			FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[fk] AND x.expires > now;
		RETURN ARRAY[0, fk, c, e, now, ep, qn];
	END IF;
	IF NOT given_back THEN
		FOR i IN 1..n LOOP
			qn := inflight_queued(f, keys[i], now);
			IF max_q >= 0 AND qn >= max_q THEN
				SELECT coalesce(sum(x.units), 0), coalesce(min(x.expires), 0) INTO c, e
					FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.expires > now;
				RETURN ARRAY[4, i, c, e, now, ep, qn];
			END IF;
			SELECT coalesce(sum(x.n), 0) INTO fq FROM inflight_flow x WHERE x.fleet = f AND x.key = keys[i] AND x.flow = fl;
			IF max_f >= 0 AND fq >= max_f THEN
				SELECT coalesce(sum(x.units), 0), coalesce(min(x.expires), 0) INTO c, e
					FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.expires > now;
				RETURN ARRAY[5, i, c, e, now, ep, fq];
			END IF;
		END LOOP;
	END IF;
	qn := inflight_queued(f, keys[fk], now);
	PERFORM inflight_enqueue(f, keys, limits, l, r, fl, weight, p, now, ttl, u);
	PERFORM inflight_alive(f, p, now, live);
	PERFORM inflight_in_time(not_after);
	SELECT coalesce(sum(x.units), 0), coalesce(min(x.expires), 0) INTO c, e
		FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[fk] AND x.expires > now;
	RETURN ARRAY[3, fk, c, e, now, ep, qn + 1];
END $$;

-- inflight_still_queued: see queuedkey.sql; the reply's count and earliest
-- expiry are those its look at the named key read (above).
CREATE OR REPLACE FUNCTION inflight_still_queued(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint,
	known bigint, pause bigint, p text, live bigint) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	n int := array_length(keys, 1);
	now bigint := inflight_now_us() / 1000;
	places int;
	u int;
	c bigint;
	e bigint;
	cs bigint[] := '{}'; -- each key's units at now
	es bigint[] := '{}'; -- and earliest expiry after now (0: none)
	h inflight_ticket;
	w int := 0; -- the key it names
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
		SELECT coalesce(sum(x.units), 0), coalesce(min(x.expires), 0) INTO c, e
			FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.expires > now;
		cs[i] := c;
		es[i] := e;
		IF c + u <= limits[i] THEN
			SELECT * INTO h FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[i] ORDER BY x.rank, x.tag, x.seq LIMIT 1;
			IF NOT FOUND OR h.units > limits[i] OR c + h.units <= limits[i] OR h.expires <= now
				OR n = 1 AND array_length(h.keys, 1) = 1 AND h.passed_units < {{passFactor}} * h.units
				OR NOT EXISTS (SELECT 1 FROM inflight_proc x WHERE x.fleet = f AND x.proc = h.proc AND x.alive_until > now + live / 2) THEN
				RETURN NULL;
			END IF;
			-- Serving stops at that head (of several keys, or passed its
			-- bound): the key is kept for it.
			IF w = 0 AND (array_length(h.keys, 1) > 1 OR h.passed_units >= {{passFactor}} * h.units) THEN
				w := i;
			END IF;
		ELSIF w = 0 THEN
			w := i; -- no room for its units
		END IF;
	END LOOP;
	w := greatest(w, 1);
	IF NOT inflight_heard(f, now, ttl, false) THEN
		RETURN NULL; -- a silence: the whole path makes the leases last
	END IF;
	UPDATE inflight_ticket x SET expires = now + 3 * ttl, limits = inflight_still_queued.limits
		WHERE (x.fleet, x.key, x.ticket) IN (SELECT y.fleet, y.key, y.ticket FROM inflight_ticket y
			WHERE y.fleet = f AND y.key = ANY (keys) AND y.ticket = l FOR UPDATE SKIP LOCKED);
	UPDATE inflight_proc x SET alive_until = greatest(x.alive_until, now + live)
		WHERE (x.fleet, x.proc) IN (SELECT y.fleet, y.proc FROM inflight_proc y WHERE y.fleet = f AND y.proc = p FOR UPDATE SKIP LOCKED);
	RETURN ARRAY[3, w, cs[w], es[w], now, known, inflight_queued(f, keys[w], now)];
END $$;
