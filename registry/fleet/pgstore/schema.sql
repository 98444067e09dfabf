-- The fleet's tables and functions, schema version 1 (see migrate.go).
-- Every row carries its fleet's name, so fleets share the tables. Times
-- are the database's clock (clock_timestamp(), read after any lock wait),
-- in milliseconds since the Unix epoch; lease ids and tickets are the
-- client's. Each operation is one function call, one statement, one
-- transaction: no session state outlives it.
--
-- Revisions (migrate.go) add to it: budget.sql (revision 1) the budgets,
-- units.sql (revision 2) the units a lease weighs, replacing the functions
-- marked "units.sql" below with ones that weigh (where their parameters
-- grew, the signatures here stay, as calls of the new ones), asks.sql
-- (revision 3) the waiter's asks and claims answered without the keys'
-- locks, replacing inflight_still_queued again, turns.sql (revision 4)
-- flows' turns counted in units, replacing inflight_enqueue and
-- inflight_unqueue, and plans.sql (revision 5) the small functions that
-- use a table in PL/pgSQL, replacing six of them.

-- The fleet: its epoch (the database's clock, in microseconds, when a
-- call first found the fleet missing, or found it may have lost data: see
-- inflight_epoch) and the end of a pause of new admissions.
CREATE TABLE inflight_fleet (
	fleet text PRIMARY KEY,
	epoch bigint NOT NULL,
	pause_until bigint NOT NULL DEFAULT 0,
	-- the longest pause and TTL (ms) callers have asked for: the pause the
	-- store declares itself when it finds its marker gone
	last_pause bigint NOT NULL DEFAULT 0,
	last_ttl bigint NOT NULL DEFAULT 0
);

-- The epoch's marker, in an unlogged table: crash recovery empties it,
-- and a promoted standby has it empty, while a clean restart keeps it. A
-- fleet whose marker is missing may have lost its last commits (those
-- made asynchronously, or not yet on the standby): a new epoch.
CREATE UNLOGGED TABLE inflight_marker (
	fleet text PRIMARY KEY,
	epoch bigint NOT NULL
);

-- A capped key: the row every call on the key locks first, and its
-- queue's state: the virtual time of each class (start-time fair queuing)
-- and the sequence of its tickets.
CREATE TABLE inflight_key (
	fleet text NOT NULL,
	key text NOT NULL,
	vt float8[] NOT NULL DEFAULT '{0,0,0}',
	seq bigint NOT NULL DEFAULT 0,
	PRIMARY KEY (fleet, key)
) WITH (fillfactor = 50);

-- A lease on a key, until expires; granted while it is a waiter's grant
-- not yet claimed. Only the primary key is indexed, so a renewal's or a
-- claim's update stays HOT.
CREATE TABLE inflight_lease (
	fleet text NOT NULL,
	key text NOT NULL,
	lease text NOT NULL,
	expires bigint NOT NULL,
	granted bool NOT NULL DEFAULT false,
	PRIMARY KEY (fleet, key, lease)
) WITH (fillfactor = 50);

-- A ticket queued on a key: its place (class rank, start tag, sequence),
-- its process, flow, arrival in the fleet, finish tag, the grants that
-- passed it over, whether it is urgent, its keys and their limits (a
-- ticket of several keys), and when it expires if its waiters stop asking.
CREATE TABLE inflight_ticket (
	fleet text NOT NULL,
	key text NOT NULL,
	ticket text NOT NULL,
	rank smallint NOT NULL,
	tag float8 NOT NULL,
	seq bigint NOT NULL,
	proc text NOT NULL,
	flow text NOT NULL,
	arrival bigint NOT NULL,
	finish float8 NOT NULL,
	passed int NOT NULL DEFAULT 0,
	urgent bool NOT NULL DEFAULT false,
	keys text[] NOT NULL,
	limits bigint[] NOT NULL,
	expires bigint NOT NULL,
	PRIMARY KEY (fleet, key, ticket)
) WITH (fillfactor = 70);
CREATE INDEX inflight_ticket_order ON inflight_ticket (fleet, key, rank, tag, seq);

-- A flow's state in a class on a key: its finish tag (null: dropped),
-- the start of its turns not yet granted, and its tickets queued.
CREATE TABLE inflight_flow (
	fleet text NOT NULL,
	key text NOT NULL,
	rank smallint NOT NULL,
	flow text NOT NULL,
	finish float8,
	base float8,
	n int NOT NULL DEFAULT 0,
	PRIMARY KEY (fleet, key, rank, flow)
) WITH (fillfactor = 70);

-- A process's liveness deadline.
CREATE TABLE inflight_proc (
	fleet text NOT NULL,
	proc text NOT NULL,
	alive_until bigint NOT NULL,
	PRIMARY KEY (fleet, proc)
) WITH (fillfactor = 50);

-- An abandoned lease id: no call adds it before until.
CREATE TABLE inflight_tomb (
	fleet text NOT NULL,
	lease text NOT NULL,
	until bigint NOT NULL,
	PRIMARY KEY (fleet, lease)
);

-- A learned cap's state, as the client encodes it.
CREATE TABLE inflight_learned (
	fleet text NOT NULL,
	key text NOT NULL,
	state text NOT NULL,
	expires bigint NOT NULL,
	PRIMARY KEY (fleet, key)
);

CREATE SEQUENCE inflight_arrival;

CREATE FUNCTION inflight_now_us() RETURNS bigint LANGUAGE sql VOLATILE AS $$
	SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;

-- The channel of a process's grants, and of a fleet's learned states.
CREATE FUNCTION inflight_channel(f text, name text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
	SELECT 'inflight_' || left(md5(f), 16) || '_' || left(md5(name), 16)
$$;

-- inflight_epoch returns the fleet's epoch, making it if missing or if
-- its marker is (see inflight_marker), and the end of the pause of new
-- admissions (0: none), declaring the pause if the caller saw another
-- epoch (known) and asks for one (pause ms): until the epoch's birth plus
-- min(pause, ttl). Unlike Redis, the store can tell a loss from a first
-- start (the fleet's row is there, its marker is not): then it declares
-- the pause itself, as long as the longest its callers have asked for, so
-- that no call, a release's or a new process's, serves or admits over the
-- leases that holders are about to put back. A pause that ends more than
-- max(ttl, 5 min) after the birth or after now is not honoured.
CREATE FUNCTION inflight_epoch(f text, now bigint, now_us bigint, known bigint, pause bigint, ttl bigint,
	OUT epoch bigint, OUT paused bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	born bigint;
	bound bigint := greatest(ttl, 300000);
	pu bigint;
BEGIN
	SELECT x.epoch, x.pause_until INTO epoch, pu FROM inflight_fleet x
		WHERE x.fleet = f AND EXISTS (SELECT 1 FROM inflight_marker m WHERE m.fleet = f AND m.epoch = x.epoch);
	IF NOT FOUND THEN
		-- Missing, or data may be lost: one call makes the new epoch, the
		-- others wait for it on the fleet's row and take it. A new epoch
		-- commits synchronously, whatever the call's mode: the fleet's row
		-- must outlive a crash, or the next one would look like a first
		-- start.
		PERFORM set_config('synchronous_commit', 'on', true);
		INSERT INTO inflight_fleet (fleet, epoch) VALUES (f, now_us) ON CONFLICT DO NOTHING;
		SELECT x.epoch, x.pause_until INTO epoch, pu FROM inflight_fleet x WHERE x.fleet = f FOR UPDATE;
		IF NOT EXISTS (SELECT 1 FROM inflight_marker m WHERE m.fleet = f AND m.epoch = epoch) THEN
			IF epoch <> now_us THEN -- the row was there: data may be lost
				UPDATE inflight_fleet x SET epoch = now_us,
					pause_until = CASE WHEN x.last_pause > 0 THEN now + least(x.last_pause, x.last_ttl) ELSE 0 END
					WHERE x.fleet = f RETURNING x.pause_until INTO pu;
				epoch := now_us;
			END IF;
			INSERT INTO inflight_marker AS m (fleet, epoch) VALUES (f, epoch)
				ON CONFLICT (fleet) DO UPDATE SET epoch = EXCLUDED.epoch;
		END IF;
	END IF;
	IF pause > 0 THEN
		UPDATE inflight_fleet x SET last_pause = greatest(x.last_pause, pause), last_ttl = greatest(x.last_ttl, ttl)
			WHERE x.fleet = f AND (x.last_pause < pause OR x.last_ttl < ttl);
		IF FOUND THEN -- rare, and needed after a crash: durable
			PERFORM set_config('synchronous_commit', 'on', true);
		END IF;
	END IF;
	born := epoch / 1000;
	IF known > 0 AND known <> epoch AND pause > 0 AND pu <= now AND born + least(pause, ttl) > now THEN
		UPDATE inflight_fleet x SET pause_until = born + least(pause, ttl)
			WHERE x.fleet = f AND x.epoch = inflight_epoch.epoch AND x.pause_until <= now
			RETURNING x.pause_until INTO pu;
		IF NOT FOUND THEN
			SELECT x.pause_until INTO pu FROM inflight_fleet x WHERE x.fleet = f;
		END IF;
	END IF;
	paused := 0;
	IF pu > now AND pu <= born + bound AND pu <= now + bound THEN
		paused := pu;
	END IF;
END $$;

-- inflight_begin starts an operation: it refuses an isolation level
-- other than READ COMMITTED (the functions count leases after waiting for
-- a key's lock, which needs a snapshot taken after the wait: under
-- REPEATABLE READ two admissions could both count the same stale set),
-- and sets how the transaction commits.
CREATE FUNCTION inflight_begin(async bool) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'inflight: the fleet''s calls need READ COMMITTED, not %', current_setting('transaction_isolation')
			USING ERRCODE = 'IF002';
	END IF;
	PERFORM set_config('synchronous_commit', CASE WHEN async THEN 'off' ELSE 'on' END, true);
END $$;

-- inflight_lock locks the rows of keys (making the missing ones), in
-- their order, so that calls on the same keys wait for each other and
-- calls on several keys cannot deadlock. Only missing rows are inserted:
-- an insert that meets a row another call has updated would wait for it.
-- (Replaced by sweep.sql, revision 13, which deletes idle keys' rows: a
-- row deleted between this insert and this lock was not locked.)
CREATE FUNCTION inflight_lock(f text, keys text[]) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	INSERT INTO inflight_key (fleet, key)
		SELECT f, k FROM unnest(keys) k
		WHERE NOT EXISTS (SELECT 1 FROM inflight_key x WHERE x.fleet = f AND x.key = k)
		ORDER BY k ON CONFLICT DO NOTHING;
	PERFORM 1 FROM inflight_key x WHERE x.fleet = f AND x.key = ANY (keys) ORDER BY x.key FOR UPDATE;
END $$;

-- inflight_trylock locks key's row if no other call holds it, and reports
-- whether it did, never waiting: serving one key's queue may grant a
-- ticket of several keys, whose other keys are locked so (a wait there
-- could deadlock); a ticket whose keys are busy waits for their calls,
-- which serve it. The rows of a queued ticket's keys exist (a key's row
-- is deleted only with nothing on it, sweep.sql).
CREATE FUNCTION inflight_trylock(f text, k text) RETURNS bool LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	PERFORM 1 FROM inflight_key x WHERE x.fleet = f AND x.key = k FOR UPDATE SKIP LOCKED;
	RETURN FOUND;
END $$;

-- Replaced by units.sql (a count in units, and inflight_units beside it).
CREATE FUNCTION inflight_count(f text, k text, now bigint) RETURNS int LANGUAGE sql STABLE AS $$
	SELECT count(*)::int FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires > now
$$;

CREATE FUNCTION inflight_earliest(f text, k text, now bigint) RETURNS bigint LANGUAGE sql STABLE AS $$
	SELECT coalesce(min(x.expires), 0) FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires > now
$$;

CREATE FUNCTION inflight_queued(f text, k text, now bigint) RETURNS int LANGUAGE sql STABLE AS $$
	SELECT count(*)::int FROM inflight_ticket x WHERE x.fleet = f AND x.key = k
$$;

-- inflight_unqueue takes ticket out of k's queue, with its flow's counts,
-- and reports whether it was queued. A flow's turns in a class are
-- charged from its first waiter queued while it had none there (base) and
-- as each is granted (base moves to the granted ticket's finish tag): if
-- its last waiter there leaves without a grant, its finish tag goes back
-- to base. A waiter that leaves while others of its flow wait gives its
-- turn back if it was the newest (the flow's finish tag is its own).
CREATE FUNCTION inflight_unqueue(f text, k text, t text, leaving bool) RETURNS bool LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	q inflight_ticket;
	fl inflight_flow;
BEGIN
	DELETE FROM inflight_ticket x WHERE x.fleet = f AND x.key = k AND x.ticket = t RETURNING * INTO q;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	SELECT * INTO fl FROM inflight_flow x WHERE x.fleet = f AND x.key = k AND x.rank = q.rank AND x.flow = q.flow;
	IF FOUND THEN
		IF NOT leaving AND q.finish > coalesce(fl.base, 0) THEN
			fl.base := q.finish;
		END IF;
		IF leaving AND fl.finish = q.finish THEN
			fl.finish := q.tag; -- the newest gives its turn back
		END IF;
		fl.n := fl.n - 1;
		IF fl.n <= 0 THEN
			IF leaving AND fl.base IS NOT NULL THEN
				fl.finish := fl.base;
			END IF;
			fl.base := NULL;
			fl.n := 0;
		END IF;
		IF fl.n = 0 AND fl.finish IS NULL THEN
			DELETE FROM inflight_flow x WHERE x.fleet = f AND x.key = k AND x.rank = q.rank AND x.flow = q.flow;
		ELSE
			UPDATE inflight_flow x SET finish = fl.finish, base = fl.base, n = fl.n
				WHERE x.fleet = f AND x.key = k AND x.rank = q.rank AND x.flow = q.flow;
		END IF;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k) THEN
		-- The queue is empty: tags start from 0 after every backlog.
		DELETE FROM inflight_flow x WHERE x.fleet = f AND x.key = k;
		UPDATE inflight_key x SET vt = '{0,0,0}', seq = 0 WHERE x.fleet = f AND x.key = k;
	END IF;
	RETURN true;
END $$;

-- inflight_dead reports whether proc is gone: within one and a half claim
-- windows of its liveness deadline (its waiters ask at least once a claim
-- window). Deadlines long past are deleted by renewals (inflight_gc).
CREATE FUNCTION inflight_dead(f text, p text, now bigint, claim bigint) RETURNS bool LANGUAGE sql AS $$
	SELECT coalesce((SELECT x.alive_until <= now + 1.5 * claim FROM inflight_proc x WHERE x.fleet = f AND x.proc = p), true)
$$;

-- inflight_drop takes ticket t out of the queues of its keys: k (locked
-- by the caller) and each other one that no other call holds (see
-- inflight_trylock); a busy key's call meets it and drops it there.
CREATE FUNCTION inflight_drop(f text, k text, keys text[], t text) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	o text;
BEGIN
	FOREACH o IN ARRAY keys LOOP
		IF o = k OR inflight_trylock(f, o) THEN
			PERFORM inflight_unqueue(f, o, t, true);
		END IF;
	END LOOP;
END $$;

-- Replaced by units.sql (it weighs units).
-- inflight_room returns the places k has under lim for ticket t, which
-- arrived at arrival (t null: a newcomer): its free capacity, less the
-- place kept for k's oldest urgent ticket unless that is t or came later.
-- An urgent ticket whose process is dead is dropped first.
CREATE FUNCTION inflight_room(f text, k text, lim bigint, t text, arrival bigint, now bigint, claim bigint) RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	free bigint;
	u inflight_ticket;
BEGIN
	DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires <= now; -- expired
	free := lim - inflight_count(f, k, now);
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
			IF u.ticket IS DISTINCT FROM t AND (arrival IS NULL OR u.arrival < arrival) THEN
				free := free - 1;
			END IF;
			RETURN free;
		END IF;
	END LOOP;
	RETURN free - 1;
END $$;

-- Replaced by units.sql (it weighs units).
-- inflight_can_take reports whether ticket t (arrival) can take a place
-- on each of its keys now. Keys other than k are locked if free (see
-- inflight_trylock); one that is not is no place now.
CREATE FUNCTION inflight_can_take(f text, k text, keys text[], limits bigint[], t text, arrival bigint, now bigint, claim bigint)
	RETURNS bool LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	FOR i IN 1..array_length(keys, 1) LOOP
		IF keys[i] <> k AND NOT inflight_trylock(f, keys[i]) THEN
			RETURN false;
		END IF;
		IF inflight_room(f, keys[i], limits[i], t, arrival, now, claim) <= 0 THEN
			RETURN false;
		END IF;
	END LOOP;
	RETURN true;
END $$;

-- Replaced by units.sql (it weighs units).
-- inflight_grant gives ticket t a lease of the claim window on each of
-- its keys, takes it out of their queues (moving each class's virtual time
-- to its start tag there, and dropping the finish tags that passes), and
-- wakes its process.
CREATE FUNCTION inflight_grant(f text, keys text[], t text, p text, now bigint, claim bigint) RETURNS void LANGUAGE plpgsql AS $$
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
		-- A lease the ticket holds already (put back) is not shortened.
		INSERT INTO inflight_lease AS x (fleet, key, lease, expires, granted) VALUES (f, k, t, now + claim, true)
			ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = greatest(x.expires, EXCLUDED.expires);
	END LOOP;
	PERFORM pg_notify(inflight_channel(f, p), t);
END $$;

-- Replaced by units.sql (it weighs units).
-- inflight_serve grants k's waiters in order, from the one at index
-- from (0: the head), while k has room under lim: each that can take it
-- on all of its keys; a waiter of a dead process is dropped. If it stops
-- at its bound on the waiters it looks at, with room left and waiters
-- further back, it returns one more than the index of the first of those;
-- else 0.
CREATE FUNCTION inflight_serve(f text, k text, lim bigint, now bigint, claim bigint, start int) RETURNS int LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	i int := start;
	steps int := 0;
	passed text[] := '{}';
	q inflight_ticket;
	ls bigint[];
	pt text;
BEGIN
	IF NOT EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k) THEN
		RETURN 0; -- nobody waits: the common case, at one probe's cost
	END IF;
	LOOP
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires <= now; -- expired
		IF inflight_count(f, k, now) >= lim THEN
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
		ELSIF inflight_can_take(f, k, q.keys, ls, q.ticket, q.arrival, now, claim) THEN
			PERFORM inflight_grant(f, q.keys, q.ticket, q.proc, now, claim);
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

-- Replaced by units.sql (it weighs units).
-- inflight_enqueue queues ticket t on each of its keys, numbering its
-- arrival in the fleet's order. A flow's start tag in a class is its
-- finish tag there or the class's virtual time, whichever is later; its
-- place sorts by the tag to the microunit (as Redis's queue sorts), so
-- that turns of flows that meet, 1/3+1/3+1/3 against 1, go by arrival.
CREATE FUNCTION inflight_enqueue(f text, keys text[], limits bigint[], t text, r smallint, fl text, weight int, p text, now bigint, ttl bigint)
	RETURNS void LANGUAGE plpgsql AS $$
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
		INSERT INTO inflight_ticket (fleet, key, ticket, rank, tag, seq, proc, flow, arrival, finish, keys, limits, expires)
			VALUES (f, k, t, r, round(tag::numeric, 6)::float8, s, p, fl, arrival, tag + 1.0 / weight, keys, limits, now + 3 * ttl);
	END LOOP;
END $$;

-- inflight_alive renews proc's liveness deadline.
CREATE FUNCTION inflight_alive(f text, p text, now bigint, ms bigint) RETURNS void LANGUAGE sql AS $$
	INSERT INTO inflight_proc AS x (fleet, proc, alive_until) VALUES (f, p, now + ms)
		ON CONFLICT (fleet, proc) DO UPDATE SET alive_until = EXCLUDED.alive_until
$$;

CREATE FUNCTION inflight_abandoned(f text, l text, now bigint) RETURNS bool LANGUAGE sql AS $$
	SELECT EXISTS (SELECT 1 FROM inflight_tomb x WHERE x.fleet = f AND x.lease = l AND x.until > now)
$$;

-- Replaced by units.sql (it weighs units).
-- inflight_still_queued answers a ticket that asks again while it is
-- queued on each of its keys and each of them is full, without locking
-- the keys: most of a full key's calls are its waiters asking, and each
-- would otherwise wait for the key's row behind the releases that serve
-- them. It renews the ticket and its process, skipping a row another call
-- holds (the next ask renews it; that call may be serving the ticket), and
-- returns what inflight_admit would. It returns NULL, for inflight_admit's
-- whole path, when anything else may be due: a key with room (a lease
-- expired, a raised limit), the ticket granted, abandoned or not queued
-- on every key, its process not known alive, an epoch other than the
-- caller's, a pause or its settings. A release committed after its reads
-- serves the queue itself.
CREATE FUNCTION inflight_still_queued(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint,
	known bigint, pause bigint, p text, live bigint) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	n int := array_length(keys, 1);
	now bigint := inflight_now_us() / 1000;
	fl inflight_fleet;
BEGIN
	IF known <= 0 OR not_after > 0 AND now > not_after THEN
		RETURN NULL;
	END IF;
	SELECT * INTO fl FROM inflight_fleet x WHERE x.fleet = f AND x.epoch = known
		AND EXISTS (SELECT 1 FROM inflight_marker m WHERE m.fleet = f AND m.epoch = known);
	IF NOT FOUND OR fl.pause_until > now OR pause > 0 AND (fl.last_pause < pause OR fl.last_ttl < ttl) THEN
		RETURN NULL;
	END IF;
	IF (SELECT count(*) FROM inflight_ticket x WHERE x.fleet = f AND x.key = ANY (keys) AND x.ticket = l) <> n
		OR EXISTS (SELECT 1 FROM inflight_lease x WHERE x.fleet = f AND x.key = ANY (keys) AND x.lease = l)
		OR inflight_abandoned(f, l, now)
		OR NOT EXISTS (SELECT 1 FROM inflight_proc x WHERE x.fleet = f AND x.proc = p AND x.alive_until > now) THEN
		RETURN NULL;
	END IF;
	FOR i IN 1..n LOOP
		IF inflight_count(f, keys[i], now) < limits[i] THEN
			RETURN NULL;
		END IF;
	END LOOP;
	UPDATE inflight_ticket x SET expires = now + 3 * ttl, limits = inflight_still_queued.limits
		WHERE (x.fleet, x.key, x.ticket) IN (SELECT y.fleet, y.key, y.ticket FROM inflight_ticket y
			WHERE y.fleet = f AND y.key = ANY (keys) AND y.ticket = l FOR UPDATE SKIP LOCKED);
	UPDATE inflight_proc x SET alive_until = greatest(x.alive_until, now + live)
		WHERE (x.fleet, x.proc) IN (SELECT y.fleet, y.proc FROM inflight_proc y WHERE y.fleet = f AND y.proc = p FOR UPDATE SKIP LOCKED);
	RETURN ARRAY[3, 1, inflight_count(f, keys[1], now), inflight_earliest(f, keys[1], now), now, fl.epoch, inflight_queued(f, keys[1], now)];
END $$;

-- Replaced by units.sql (it weighs units).
-- inflight_admit is the admission call (fleet.AdmitCall, which tells its
-- steps). It returns {status, index of the key (1-based; 0: none), its
-- lease count, its earliest expiry (the pause's end if paused; the start
-- in microseconds for an admission with starts), now, epoch, queue
-- length}, then, for an admission with starts, each key's lease count.
CREATE FUNCTION inflight_admit(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint, known bigint,
	pause bigint, wait bool, starts bool, claim bigint, r smallint, fl text, weight int, p text, max_q int, max_f int,
	live bigint, async bool, carried_keys text[], carried_leases text[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	n int := array_length(keys, 1);
	now bigint;
	now_us bigint;
	ep bigint;
	paused bigint;
	stopped bool;
	held int := 0;
	cut int := 0;
	fk int := 0;
	queued bool[] := '{}';
	any_queued bool;
	stop_at int[] := '{}';
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
			INSERT INTO inflight_lease AS x (fleet, key, lease, expires) VALUES (f, carried_keys[j], carried_leases[j], now + ttl)
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
	FOR i IN 1..n LOOP
		stop_at[i] := 0;
		IF queued[i] AND NOT stopped THEN
			stop_at[i] := inflight_serve(f, keys[i], limits[i], now, claim, 0);
		END IF;
		IF stop_at[i] > 0 AND cut = 0 THEN
			cut := i;
		END IF;
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.expires <= now; -- expired
		IF EXISTS (SELECT 1 FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.lease = l) THEN
			held := held + 1;
		END IF;
	END LOOP;
	-- A grant made under a limit that has dropped since is given back, and
	-- its places served; its waiter queues again, past the bounds.
	IF held = n THEN
		FOR i IN 1..n LOOP
			IF inflight_count(f, keys[i], now) > limits[i] THEN
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
				PERFORM inflight_serve(f, keys[i], limits[i], now, claim, 0);
			END IF;
		END LOOP;
	END IF;
	IF stopped THEN
		RETURN ARRAY[2, 0, inflight_count(f, keys[1], now), paused, now, ep, 0];
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
		-- Serving stopped short of it: it takes the room if it can.
		IF cut > 0 AND inflight_can_take(f, keys[1], keys, limits, l, mine.arrival, now, claim) THEN
			FOR i IN 1..n LOOP
				PERFORM inflight_unqueue(f, keys[i], l, false);
			END LOOP;
			INSERT INTO inflight_lease (fleet, key, lease, expires) SELECT f, k, l, now + ttl FROM unnest(keys) k
				ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = EXCLUDED.expires;
			RETURN inflight_admitted(f, keys, n, starts, now, now_us, ep, not_after);
		END IF;
		-- It names the first of its keys without room (the first if none).
		w := 1;
		FOR i IN 1..n LOOP
			IF inflight_count(f, keys[i], now) >= limits[i] THEN
				w := i;
				EXIT;
			END IF;
		END LOOP;
		RETURN ARRAY[3, w, inflight_count(f, keys[w], now), inflight_earliest(f, keys[w], now), now, ep, inflight_queued(f, keys[w], now)];
	END IF;
	-- A newcomer: where serving stopped short, it looks further; it takes
	-- the room only if no waiter that it has looked at can.
	FOR i IN 1..n LOOP
		IF stop_at[i] > 0 AND inflight_serve(f, keys[i], limits[i], now, claim, stop_at[i] - 1) > 0 THEN
			fk := i;
			EXIT;
		END IF;
	END LOOP;
	IF fk = 0 THEN
		FOR i IN 1..n LOOP
			IF queued[i] THEN
				room := inflight_room(f, keys[i], limits[i], NULL, NULL, now, claim);
			ELSE
				room := limits[i] - inflight_count(f, keys[i], now);
			END IF;
			IF room <= 0 THEN
				fk := i;
				EXIT;
			END IF;
		END LOOP;
	END IF;
	IF fk = 0 THEN
		INSERT INTO inflight_lease (fleet, key, lease, expires) SELECT f, k, l, now + ttl FROM unnest(keys) k
			ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = EXCLUDED.expires;
		RETURN inflight_admitted(f, keys, n, starts, now, now_us, ep, not_after);
	END IF;
	qn := inflight_queued(f, keys[fk], now);
	IF NOT wait THEN
		RETURN ARRAY[0, fk, inflight_count(f, keys[fk], now), inflight_earliest(f, keys[fk], now), now, ep, qn];
	END IF;
	IF NOT given_back THEN
		FOR i IN 1..n LOOP
			qn := inflight_queued(f, keys[i], now);
			IF max_q >= 0 AND qn >= max_q THEN
				RETURN ARRAY[4, i, inflight_count(f, keys[i], now), inflight_earliest(f, keys[i], now), now, ep, qn];
			END IF;
			SELECT coalesce(sum(x.n), 0) INTO fq FROM inflight_flow x WHERE x.fleet = f AND x.key = keys[i] AND x.flow = fl;
			IF max_f >= 0 AND fq >= max_f THEN
				RETURN ARRAY[5, i, inflight_count(f, keys[i], now), inflight_earliest(f, keys[i], now), now, ep, fq];
			END IF;
		END LOOP;
	END IF;
	qn := inflight_queued(f, keys[fk], now);
	PERFORM inflight_enqueue(f, keys, limits, l, r, fl, weight, p, now, ttl);
	PERFORM inflight_alive(f, p, now, live);
	PERFORM inflight_in_time(not_after);
	RETURN ARRAY[3, fk, inflight_count(f, keys[fk], now), inflight_earliest(f, keys[fk], now), now, ep, qn + 1];
END $$;

-- inflight_in_time raises, rolling the call back, if the database's
-- clock has passed not_after (0: none) while the call waited for a lock.
CREATE FUNCTION inflight_in_time(not_after bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF not_after > 0 AND inflight_now_us() / 1000 > not_after THEN
		RAISE EXCEPTION 'inflight: the call ran past its not-after time' USING ERRCODE = 'IF001';
	END IF;
END $$;

-- Replaced by units.sql (it weighs units).
-- inflight_admitted is an admission's reply. Its counts, the evidence of a
-- learned cap, leave out the grants not claimed yet: their requests are
-- not at the upstream.
CREATE FUNCTION inflight_admitted(f text, keys text[], n int, starts bool, now bigint, now_us bigint, ep bigint, not_after bigint)
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
		res := res || (SELECT count(*) FROM inflight_lease x
			WHERE x.fleet = f AND x.key = keys[i] AND x.expires > now AND NOT x.granted);
	END LOOP;
	RETURN res;
END $$;

-- Replaced by budget.sql (it deletes budgets' steps too).
-- inflight_gc deletes, a few at a time and never waiting, what nothing
-- else deletes: leases long expired on keys nobody calls any more,
-- tombstones past, and processes long gone.
CREATE FUNCTION inflight_gc(f text, now bigint) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	DELETE FROM inflight_lease x WHERE x.ctid IN
		(SELECT y.ctid FROM inflight_lease y WHERE y.fleet = f AND y.expires < now - 600000 LIMIT 64 FOR UPDATE SKIP LOCKED);
	DELETE FROM inflight_tomb x WHERE x.ctid IN
		(SELECT y.ctid FROM inflight_tomb y WHERE y.fleet = f AND y.until <= now LIMIT 64 FOR UPDATE SKIP LOCKED);
	DELETE FROM inflight_proc x WHERE x.ctid IN
		(SELECT y.ctid FROM inflight_proc y WHERE y.fleet = f AND y.alive_until < now - 600000 LIMIT 16 FOR UPDATE SKIP LOCKED);
END $$;

-- Replaced by units.sql (it weighs units).
-- inflight_renew is the renewal call (fleet.RenewCall). Leases come as
-- parallel arrays; each lease's keys and limits are the next nkeys[i] of
-- keys and limits. It returns {epoch, now, each lease's fate}, or
-- {-2, now} past not_after.
CREATE FUNCTION inflight_renew(f text, ttl bigint, not_after bigint, known bigint, pause bigint, async bool,
	leases text[], modes int[], epochs bigint[], nkeys int[], keys text[], limits bigint[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
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
						IF inflight_count(f, ks[missing[m]], now) >= ls[missing[m]] THEN
							room := false;
						END IF;
					END LOOP;
				END IF;
				IF room THEN
					FOR m IN 1..array_length(missing, 1) LOOP
						INSERT INTO inflight_lease (fleet, key, lease, expires) VALUES (f, ks[missing[m]], leases[i], now + ttl);
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

-- inflight_freeing starts a call that frees room on keys (a release, an
-- abandon): it locks them and returns now and whether their queues are to
-- be served: not while a pause is declared. It goes through the epoch, so
-- that a lost marker declares the pause before anything is served.
CREATE FUNCTION inflight_freeing(f text, keys text[], async bool, OUT now bigint, OUT serving bool) LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now_us bigint;
BEGIN
	PERFORM inflight_begin(async);
	PERFORM inflight_lock(f, keys);
	now_us := inflight_now_us();
	now := now_us / 1000;
	PERFORM inflight_epoch(f, now, now_us, 0, 0, 0);
	serving := NOT EXISTS (SELECT 1 FROM inflight_fleet x WHERE x.fleet = f AND x.pause_until > now);
END $$;

-- inflight_release removes each (key, lease) pair and serves each key's
-- queue, unless new admissions are paused. Replaced by release.sql (it
-- serves each key once, with all the room the call freed).
CREATE FUNCTION inflight_release(f text, claim bigint, keys text[], leases text[], limits bigint[], async bool) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now bigint;
	serving bool;
BEGIN
	SELECT * INTO now, serving FROM inflight_freeing(f, keys, async);
	FOR i IN 1..coalesce(array_length(keys, 1), 0) LOOP
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.lease = leases[i];
		IF serving THEN
			PERFORM inflight_serve(f, keys[i], limits[i], now, claim, 0);
		END IF;
	END LOOP;
END $$;

-- inflight_abandon takes lease l out of its keys' queues and leases and
-- leaves a tombstone for ttl, and at least until not_after; with limits,
-- it serves the keys' queues, unless new admissions are paused.
CREATE FUNCTION inflight_abandon(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint, claim bigint, async bool)
	RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now bigint;
	serving bool;
	stay bigint := ttl;
BEGIN
	SELECT * INTO now, serving FROM inflight_freeing(f, keys, async);
	FOR i IN 1..coalesce(array_length(keys, 1), 0) LOOP
		PERFORM inflight_unqueue(f, keys[i], l, true);
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.lease = l;
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

-- inflight_learned reads a learned state and, with a state to write,
-- writes it if the stored one has the version presumed ('-': none; '?':
-- one without a version) and publishes it. It returns {'1'} if it wrote;
-- else {'0', the version, the state (none if missing)}, and keeps a state
-- read from expiring.
CREATE FUNCTION inflight_learned(f text, k text, presumed text, state text, ttl bigint) RETURNS text[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now bigint;
	raw text;
	exp bigint;
	v text;
BEGIN
	now := inflight_now_us() / 1000;
	LOOP
		SELECT x.state, x.expires INTO raw, exp FROM inflight_learned x WHERE x.fleet = f AND x.key = k FOR UPDATE;
		IF FOUND AND exp <= now THEN
			DELETE FROM inflight_learned x WHERE x.fleet = f AND x.key = k;
			raw := NULL;
		END IF;
		v := '-';
		IF raw IS NOT NULL THEN
			v := coalesce(substring(raw FROM '"v":([0-9]+)[,}]'), '?');
		END IF;
		EXIT WHEN state = '' OR v <> presumed;
		IF raw IS NULL THEN
			-- Two writers may find it missing: the second finds it written.
			INSERT INTO inflight_learned (fleet, key, state, expires) VALUES (f, k, state, now + ttl) ON CONFLICT DO NOTHING;
			CONTINUE WHEN NOT FOUND;
		ELSE
			UPDATE inflight_learned x SET state = inflight_learned.state, expires = now + ttl WHERE x.fleet = f AND x.key = k;
		END IF;
		BEGIN
			PERFORM pg_notify(inflight_channel(f, '#learned'), state);
		EXCEPTION WHEN OTHERS THEN
			-- Written all the same: the others read it within a second.
			RETURN ARRAY['1', SQLERRM];
		END;
		RETURN ARRAY['1'];
	END LOOP;
	IF raw IS NULL THEN
		RETURN ARRAY['0', v];
	END IF;
	IF exp - now < ttl / 2 THEN
		UPDATE inflight_learned x SET expires = now + ttl WHERE x.fleet = f AND x.key = k;
	END IF;
	RETURN ARRAY['0', v, raw];
END $$;
