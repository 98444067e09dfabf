-- Schema version 1, revision 2 (see migrate.go): leases weigh units
-- (driver.AdmitCall.Units). A lease weighs its units, 1 or more, on each
-- of its keys; a key's count is the sum of the units of its leases not
-- expired, and a lease of u units has room on a key under limit L when the
-- count plus u is at most L. Every count the functions report is in units.
--
-- The lease and ticket tables get a units column, 1 for the rows there
-- already (what they weighed): a constant default, so no table is
-- rewritten, and the calls wait for the migration's transaction only. The
-- functions that count, serve and admit are replaced by ones that weigh,
-- and keep a heavy waiter's room for it (inflight_serve,
-- inflight_behind_heavy).
-- Where their parameters grew (inflight_admit, inflight_renew and three
-- helpers) the new ones are new signatures, and the previous signatures
-- stay as calls of them (see the end of this file): a process of the
-- previous release, side by side with this one in a rolling deploy, calls
-- those, and so counts the weighted leases' units right and keeps the
-- order of heavy waiters, its own leases weighing 1 unit.
-- inflight_count, inflight_release and inflight_abandon keep their
-- signatures.
--
-- This revision can be made again over itself (a test drops the revision
-- number to make the revisions again): it only adds what is missing and
-- replaces functions.

ALTER TABLE inflight_lease ADD COLUMN IF NOT EXISTS units int NOT NULL DEFAULT 1;
ALTER TABLE inflight_ticket ADD COLUMN IF NOT EXISTS units int NOT NULL DEFAULT 1;

-- The weighted tickets, in their places (see inflight_behind_heavy): an
-- index that a fleet of 1-unit waiters keeps empty. Their updates stay
-- HOT (a ticket's units and place never change).
CREATE INDEX IF NOT EXISTS inflight_ticket_weighted ON inflight_ticket (fleet, key, rank, tag, seq) WHERE units > 1;

-- inflight_units is k's count at now: the units of its leases not
-- expired. It reads the same rows as count(*) did (the primary key's
-- index finds the key's leases, their heap tuples tell the expiry). It is
-- PL/pgSQL, whose plan a session keeps: a SQL function's query is planned
-- again in each transaction that calls it, which took twice as long as
-- the count itself (on a test server, 32 leases: 40 µs a call as SQL, 14
-- µs so).
CREATE OR REPLACE FUNCTION inflight_units(f text, k text, now bigint) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_variable
BEGIN
	RETURN (SELECT coalesce(sum(x.units), 0) FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires > now);
END $$;

-- inflight_count, as the previous release calls it: k's count in units
-- (an int: a count past 2^31-1 units reads as that).
CREATE OR REPLACE FUNCTION inflight_count(f text, k text, now bigint) RETURNS int LANGUAGE plpgsql STABLE AS $$
BEGIN
	RETURN least(inflight_units(f, k, now), 2147483647);
END $$;

-- inflight_room (a call of inflight_room_of since count.sql, revision 9)
-- returns the units k has free under lim for ticket t, which arrived at
-- arrival (t null: a newcomer): its free capacity, less the place kept
-- for k's oldest urgent ticket (its units) unless that is t or came
-- later. A caller of u units has room if it is at least u. An
-- urgent ticket whose process is dead is dropped first.
CREATE OR REPLACE FUNCTION inflight_room(f text, k text, lim bigint, t text, arrival bigint, now bigint, claim bigint) RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	free bigint;
	u inflight_ticket;
BEGIN
	DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires <= now; -- expired
	free := lim - inflight_units(f, k, now);
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

-- inflight_behind_heavy reports whether a heavy waiter of more than one
-- unit stands before ticket t in k's queue (t not queued there: anywhere
-- in it), by its own limit on k: one whose units, at most that limit, find
-- no room on k under it. The room it waits for is not t's to take,
-- whichever of t's keys' queues is served (driver.ReleaseCall). (A waiter
-- of 1 unit without room means no room for t either, under the same
-- limit.) It looks through the index of the weighted tickets only: where
-- nobody weighs more than 1 unit, one probe of an empty index.
CREATE OR REPLACE FUNCTION inflight_behind_heavy(f text, k text, t text, now bigint) RETURNS bool LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_variable
DECLARE
	me inflight_ticket;
	c bigint;
BEGIN
	IF NOT EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k AND x.units > 1) THEN
		RETURN false;
	END IF;
	SELECT * INTO me FROM inflight_ticket x WHERE x.fleet = f AND x.key = k AND x.ticket = t;
	c := inflight_units(f, k, now);
	RETURN EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k AND x.units > 1 AND x.ticket <> t
		AND (me.ticket IS NULL OR (x.rank, x.tag, x.seq) < (me.rank, me.tag, me.seq))
		AND x.units <= x.limits[array_position(x.keys, k)] AND c + x.units > x.limits[array_position(x.keys, k)]);
END $$;

-- inflight_can_take reports whether ticket t (arrival), of units, can
-- take room for them on each of its keys now: room under its limit there,
-- and, on its keys other than k (whose queue is served), no heavy waiter
-- before it (see inflight_behind_heavy). Keys other than k are locked if
-- free (see inflight_trylock); one that is not is no room now.
CREATE OR REPLACE FUNCTION inflight_can_take(f text, k text, keys text[], limits bigint[], t text, arrival bigint, units int,
	now bigint, claim bigint) RETURNS bool LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	FOR i IN 1..array_length(keys, 1) LOOP
		IF keys[i] <> k AND NOT inflight_trylock(f, keys[i]) THEN
			RETURN false;
		END IF;
		IF inflight_room(f, keys[i], limits[i], t, arrival, now, claim) < units THEN
			RETURN false;
		END IF;
		IF keys[i] <> k AND inflight_behind_heavy(f, keys[i], t, now) THEN
			RETURN false;
		END IF;
	END LOOP;
	RETURN true;
END $$;

-- inflight_grant gives ticket t, of units, a lease of the claim window on
-- each of its keys, weighing its units, takes it out of their queues
-- (moving each class's virtual time to its start tag there, and dropping
-- the finish tags that passes), and wakes its process.
CREATE OR REPLACE FUNCTION inflight_grant(f text, keys text[], t text, p text, now bigint, claim bigint, units int)
	RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	k text;
	q inflight_ticket;
BEGIN
	FOREACH k IN ARRAY keys LOOP
		SELECT * INTO q FROM inflight_ticket x WHERE x.fleet = f AND x.key = k AND x.ticket = t;
		IF FOUND THEN
			PERFORM inflight_unqueue(f, k, t, false);
			-- A statement of its own: it sees the unqueue (an emptied queue
			-- starts its tags from 0 again).
			IF EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k) THEN
				UPDATE inflight_key x SET vt[q.rank + 1] = q.tag WHERE x.fleet = f AND x.key = k AND x.vt[q.rank + 1] < q.tag;
				IF FOUND THEN
					UPDATE inflight_flow x SET finish = NULL WHERE x.fleet = f AND x.key = k AND x.rank = q.rank AND x.finish <= q.tag;
					DELETE FROM inflight_flow x WHERE x.fleet = f AND x.key = k AND x.rank = q.rank AND x.finish IS NULL AND x.n = 0;
				END IF;
			END IF;
		END IF;
		-- A lease the ticket holds already (put back) is not shortened, and
		-- weighs what it weighs.
		INSERT INTO inflight_lease AS x (fleet, key, lease, expires, granted, units) VALUES (f, k, t, now + claim, true, units)
			ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = greatest(x.expires, EXCLUDED.expires);
	END LOOP;
	PERFORM pg_notify(inflight_channel(f, p), t);
END $$;

-- inflight_serve grants k's waiters in order, from the one at index
-- from (0: the head), while k has room under lim: each that can take room
-- for its units on all of its keys; a waiter of a dead process is
-- dropped. Order is strict for what waiters weigh: it stops at a heavy
-- waiter, one whose units, at most lim, find no room on k under lim
-- (driver.ReleaseCall), and returns -1: nobody behind it, nor a newcomer,
-- takes k's room. (A waiter of 1 unit is never heavy: k has room for it
-- or serving ends.) A waiter passed over for want of room on another key
-- (or under its own limit on k, below lim), or whose units are over lim
-- (a limit lowered under it: its process refuses it), is passed over. If
-- it stops at its bound on the waiters it looks at, with room left and
-- waiters further back, it returns one more than the index of the first
-- of those; else 0.
CREATE OR REPLACE FUNCTION inflight_serve(f text, k text, lim bigint, now bigint, claim bigint, start int) RETURNS int LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	i int := start;
	steps int := 0;
	passed text[] := '{}';
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
			RETURN 0;
		END IF;
		IF i >= start + 64 OR steps >= 256 THEN
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
			-- unit's waiter is passed over then, as before units).
			RETURN -1;
		ELSIF inflight_can_take(f, k, q.keys, ls, q.ticket, q.arrival, q.units, now, claim) THEN
			PERFORM inflight_grant(f, q.keys, q.ticket, q.proc, now, claim, q.units);
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

-- (Replaced by turns.sql, revision 4: turns counted in units.)
-- inflight_enqueue queues ticket t, of units, on each of its keys,
-- numbering its arrival in the fleet's order. A flow's start tag in a
-- class is its finish tag there or the class's virtual time, whichever is
-- later; its place sorts by the tag to the microunit (as Redis's queue
-- sorts), so that turns of flows that meet, 1/3+1/3+1/3 against 1, go by
-- arrival. (A flow's turns count waiters, whatever they weigh.)
CREATE OR REPLACE FUNCTION inflight_enqueue(f text, keys text[], limits bigint[], t text, r smallint, fl text, weight int, p text,
	now bigint, ttl bigint, units int) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	arrival bigint := nextval('inflight_arrival');
	k text;
	v float8;
	tag float8;
	s bigint;
BEGIN
	FOREACH k IN ARRAY keys LOOP
		PERFORM inflight_unqueue(f, k, t, true); -- a place left on one of its keys
		UPDATE inflight_key x SET seq = x.seq + 1 WHERE x.fleet = f AND x.key = k RETURNING x.vt[r + 1], x.seq INTO v, s;
		SELECT greatest(v, coalesce(x.finish, 0)) INTO tag FROM inflight_flow x WHERE x.fleet = f AND x.key = k AND x.rank = r AND x.flow = fl;
		IF NOT FOUND THEN
			tag := v;
		END IF;
		INSERT INTO inflight_flow AS x (fleet, key, rank, flow, finish, base, n) VALUES (f, k, r, fl, tag + 1.0 / weight, tag, 1)
			ON CONFLICT (fleet, key, rank, flow) DO UPDATE SET finish = EXCLUDED.finish, n = x.n + 1,
				base = CASE WHEN x.n = 0 THEN EXCLUDED.base ELSE x.base END;
		INSERT INTO inflight_ticket (fleet, key, ticket, rank, tag, seq, proc, flow, arrival, finish, keys, limits, expires, units)
			VALUES (f, k, t, r, round(tag::numeric, 6)::float8, s, p, fl, arrival, tag + 1.0 / weight, keys, limits, now + 3 * ttl, units);
	END LOOP;
END $$;

-- (Replaced by asks.sql, revision 3: a waiter behind a heavy waiter is
-- answered there too.)
-- inflight_still_queued answers a ticket that asks again while it is
-- queued on each of its keys and none has room for its units, without
-- locking the keys: most of a full key's calls are its waiters asking,
-- and each would otherwise wait for the key's row behind the releases that
-- serve them. It renews the ticket and its process, skipping a row
-- another call holds (the next ask renews it; that call may be serving the
-- ticket), and returns what inflight_admit would. It returns NULL, for
-- inflight_admit's whole path, when anything else may be due: a key with
-- room for its units (a lease expired, a raised limit), the ticket
-- granted, abandoned or not queued on every key, its process not known
-- alive, an epoch other than the caller's, a pause or its settings. A
-- release committed after its reads serves the queue itself. (A waiter
-- that fits where a heavy waiter before it keeps the room takes the whole
-- path, and stays queued there.)
CREATE OR REPLACE FUNCTION inflight_still_queued(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint,
	known bigint, pause bigint, p text, live bigint) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	n int := array_length(keys, 1);
	now bigint := inflight_now_us() / 1000;
	fl inflight_fleet;
	places int;
	u int;
BEGIN
	IF known <= 0 OR not_after > 0 AND now > not_after THEN
		RETURN NULL;
	END IF;
	SELECT * INTO fl FROM inflight_fleet x WHERE x.fleet = f AND x.epoch = known
		AND EXISTS (SELECT 1 FROM inflight_marker m WHERE m.fleet = f AND m.epoch = known);
	IF NOT FOUND OR fl.pause_until > now OR pause > 0 AND (fl.last_pause < pause OR fl.last_ttl < ttl) THEN
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
		IF inflight_units(f, keys[i], now) + u <= limits[i] THEN
			RETURN NULL;
		END IF;
	END LOOP;
	UPDATE inflight_ticket x SET expires = now + 3 * ttl, limits = inflight_still_queued.limits
		WHERE (x.fleet, x.key, x.ticket) IN (SELECT y.fleet, y.key, y.ticket FROM inflight_ticket y
			WHERE y.fleet = f AND y.key = ANY (keys) AND y.ticket = l FOR UPDATE SKIP LOCKED);
	UPDATE inflight_proc x SET alive_until = greatest(x.alive_until, now + live)
		WHERE (x.fleet, x.proc) IN (SELECT y.fleet, y.proc FROM inflight_proc y WHERE y.fleet = f AND y.proc = p FOR UPDATE SKIP LOCKED);
	RETURN ARRAY[3, 1, inflight_units(f, keys[1], now), inflight_earliest(f, keys[1], now), now, fl.epoch, inflight_queued(f, keys[1], now)];
END $$;

-- inflight_admitted is an admission's reply. Its counts, each key's units
-- held (the evidence of a learned cap), leave out the grants not claimed
-- yet: their requests are not at the upstream.
CREATE OR REPLACE FUNCTION inflight_admitted(f text, keys text[], n int, starts bool, now bigint, now_us bigint, ep bigint, not_after bigint)
	RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	res bigint[];
BEGIN
	PERFORM inflight_in_time(not_after);
	IF NOT starts THEN
		RETURN ARRAY[1, 0, 0, 0, now, ep, 0];
	END IF;
	res := ARRAY[1, 0, 0, now_us, now, ep, 0];
	FOR i IN 1..n LOOP
		res := res || (SELECT coalesce(sum(x.units), 0)::bigint FROM inflight_lease x
			WHERE x.fleet = f AND x.key = keys[i] AND x.expires > now AND NOT x.granted);
	END LOOP;
	RETURN res;
END $$;

-- (Replaced by silence.sql, revision 12: it never shortens a lease.)
-- inflight_admit is the admission call (fleet.AdmitCall, which tells its
-- steps), for a lease of units (0 or NULL: 1) on each key; carried_units
-- are the carried pairs' (NULL: 1 each). It returns {status, index of the
-- key (1-based; 0: none), its count in units, its earliest expiry (the
-- pause's end if paused; the start in microseconds for an admission with
-- starts), now, epoch, queue length}, then, for an admission with starts,
-- each key's units held.
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
				ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = greatest(x.expires, EXCLUDED.expires);
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
			UPDATE inflight_lease x SET expires = now + ttl, granted = false WHERE x.fleet = f AND x.key = ANY (keys) AND x.lease = l;
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
			INSERT INTO inflight_lease (fleet, key, lease, expires, units) SELECT f, k, l, now + ttl, mine.units FROM unnest(keys) k
				ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = EXCLUDED.expires;
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
		INSERT INTO inflight_lease (fleet, key, lease, expires, units) SELECT f, k, l, now + ttl, u FROM unnest(keys) k
			ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = EXCLUDED.expires, units = EXCLUDED.units;
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

-- (Replaced by silence.sql, revision 12: it never shortens a lease.)
-- inflight_renew is the renewal call (fleet.RenewCall). Leases come as
-- parallel arrays; each lease's keys and limits are the next nkeys[i] of
-- keys and limits, and units[i] what it weighs where it is put back (0 or
-- NULL: 1). It returns {epoch, now, each lease's fate}, or {-2, now} past
-- not_after.
CREATE OR REPLACE FUNCTION inflight_renew(f text, ttl bigint, not_after bigint, known bigint, pause bigint, async bool,
	leases text[], modes int[], epochs bigint[], nkeys int[], keys text[], limits bigint[], units int[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now bigint;
	now_us bigint;
	ep bigint;
	paused bigint;
	res bigint[];
	a int := 1;
	ks text[];
	ls bigint[];
	u int;
	missing int[];
	fate int;
	checked bool;
	room bool;
BEGIN
	PERFORM inflight_begin(async);
	PERFORM inflight_lock(f, keys);
	now_us := inflight_now_us();
	now := now_us / 1000;
	IF not_after > 0 AND now > not_after THEN
		RETURN ARRAY[-2, now];
	END IF;
	SELECT * INTO ep, paused FROM inflight_epoch(f, now, now_us, known, pause, ttl);
	res := ARRAY[ep, now];
	FOR i IN 1..coalesce(array_length(leases, 1), 0) LOOP
		ks := keys[a:a + nkeys[i] - 1];
		ls := limits[a:a + nkeys[i] - 1];
		a := a + nkeys[i];
		u := greatest(coalesce(units[i], 1), 1);
		missing := '{}';
		FOR j IN 1..nkeys[i] LOOP
			UPDATE inflight_lease x SET expires = now + ttl WHERE x.fleet = f AND x.key = ks[j] AND x.lease = leases[i] AND x.expires > now;
			IF NOT FOUND THEN
				DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = ks[j] AND x.lease = leases[i];
				missing := missing || j;
			END IF;
		END LOOP;
		fate := 0;
		IF array_length(missing, 1) > 0 THEN
			fate := 3;
			IF modes[i] > 0 AND NOT inflight_abandoned(f, leases[i], now) THEN
				checked := modes[i] = 1 AND (epochs[i] = 0 OR epochs[i] = ep);
				room := NOT (checked AND paused > now AND EXISTS (SELECT 1 FROM unnest(ls) x WHERE x < 9000000000000000000));
				IF checked AND room THEN
					FOR m IN 1..array_length(missing, 1) LOOP
						DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = ks[missing[m]] AND x.expires <= now; -- expired
						IF inflight_units(f, ks[missing[m]], now) + u > ls[missing[m]] THEN
							room := false;
						END IF;
					END LOOP;
				END IF;
				IF room THEN
					FOR m IN 1..array_length(missing, 1) LOOP
						INSERT INTO inflight_lease (fleet, key, lease, expires, units) VALUES (f, ks[missing[m]], leases[i], now + ttl, u);
					END LOOP;
					fate := CASE WHEN checked THEN 2 ELSE 1 END;
				END IF;
			END IF;
		END IF;
		res := res || fate::bigint;
	END LOOP;
	PERFORM inflight_in_time(not_after);
	PERFORM inflight_gc(f, now);
	RETURN res;
END $$;

-- The previous signatures, as calls of the new ones. The previous
-- release calls inflight_admit's and inflight_renew's, for leases of 1
-- unit. The helpers' are called only by that release's bodies, in a call
-- under way while this revision commits (it waits for a lock, then goes
-- on in the bodies it started with): inflight_can_take and inflight_grant
-- find the ticket's units in its row, and inflight_enqueue queues a ticket
-- of that release, of 1 unit. (In a SQL function a column's name hides a
-- parameter's: inflight_grant.keys is the parameter.)

CREATE OR REPLACE FUNCTION inflight_admit(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint, known bigint,
	pause bigint, wait bool, starts bool, claim bigint, r smallint, fl text, weight int, p text, max_q int, max_f int,
	live bigint, async bool, carried_keys text[], carried_leases text[]) RETURNS bigint[] LANGUAGE sql AS $$
	SELECT inflight_admit(f, l, keys, limits, ttl, not_after, known, pause, wait, starts, claim, r, fl, weight, p, max_q, max_f,
		live, async, carried_keys, carried_leases, 1, NULL)
$$;

CREATE OR REPLACE FUNCTION inflight_renew(f text, ttl bigint, not_after bigint, known bigint, pause bigint, async bool,
	leases text[], modes int[], epochs bigint[], nkeys int[], keys text[], limits bigint[]) RETURNS bigint[] LANGUAGE sql AS $$
	SELECT inflight_renew(f, ttl, not_after, known, pause, async, leases, modes, epochs, nkeys, keys, limits, NULL)
$$;

CREATE OR REPLACE FUNCTION inflight_can_take(f text, k text, keys text[], limits bigint[], t text, arrival bigint, now bigint, claim bigint)
	RETURNS bool LANGUAGE sql AS $$
	SELECT inflight_can_take(f, k, keys, limits, t, arrival,
		coalesce((SELECT x.units FROM inflight_ticket x WHERE x.fleet = f AND x.key = k AND x.ticket = t), 1), now, claim)
$$;

CREATE OR REPLACE FUNCTION inflight_grant(f text, keys text[], t text, p text, now bigint, claim bigint) RETURNS void LANGUAGE sql AS $$
	SELECT inflight_grant(f, keys, t, p, now, claim,
		coalesce((SELECT max(x.units) FROM inflight_ticket x WHERE x.fleet = f AND x.key = ANY (inflight_grant.keys) AND x.ticket = t), 1))
$$;

CREATE OR REPLACE FUNCTION inflight_enqueue(f text, keys text[], limits bigint[], t text, r smallint, fl text, weight int, p text,
	now bigint, ttl bigint) RETURNS void LANGUAGE sql AS $$
	SELECT inflight_enqueue(f, keys, limits, t, r, fl, weight, p, now, ttl, 1)
$$;
