-- Schema version 1, revision 13 (see migrate.go): the row of a key that
-- nothing lives on is deleted once it has been idle for ten minutes.
--
-- Before it, inflight_key kept a row for every key ever called, forever:
-- a gateway with a cap per tenant or per API key grew the table by one row
-- per key it had ever seen. A key's row is its lock, and its queue's state
-- (vt, seq); what lives on the key is its leases, its tickets and its
-- flows' turns, each in a table of its own. The row's queue state is set
-- back to a new row's whenever the key's queue empties (inflight_unqueue:
-- the tags start from 0 after every backlog, as no ticket is left whose
-- tag was taken from them), so a key with no ticket has the state a new row
-- has, and deleting its row loses nothing that any ticket, of this key or
-- of several, depends on.
--
-- The sweep (inflight_sweep, through inflight_sweep_keys) runs after each
-- renewal of this release, in a transaction of its own (a live process
-- renews at least each TTL/3, holding leases or not): not in the renewal,
-- whose keys' locks it held while it looked at 256 keys (admissions on
-- them waited 4-24 ms, a review measured), nor in the lease GC that older
-- releases' renewals run. It sweeps at most once a second per fleet: a
-- call that finds it due takes the fleet's row of inflight_sweeper if no
-- other call holds it
-- (never waiting), and looks at the next 256 of the fleet's keys after the
-- one the last sweep ended at (from the first again after the last). A key
-- with nothing on it is marked idle (inflight_idle) the first time it is
-- found so; a key found in use loses its mark; a key still found idle ten
-- minutes after its mark is deleted, if no other call holds its row (never
-- waiting). So a key is deleted once every sweep that looked at it over
-- ten minutes found it idle; one used only between two sweeps may be
-- deleted sooner, which costs its next call an insert, no more. The calls
-- never read or write a mark: they pay nothing for the sweep but, for a
-- renewal, the sweep's call after it. The delete
-- looks again, under the row's lock, for a lease (expired or not: a
-- silence may extend one that expired, inflight_heard), a ticket or a
-- flow, and every call that adds one holds the row's lock: inflight_lock
-- for the call's keys, inflight_trylock for the other keys of a ticket it
-- grants, whose row a queued ticket keeps there. A statement run after the
-- locks are taken sees what those calls committed (READ COMMITTED), and
-- none can add more until the sweep commits. While renewals come once a
-- second or more, a fleet's sweeps look at 921,600 keys an hour.
--
-- The lock every call takes first had to change for the delete.
-- inflight_lock inserted the missing rows and then locked them all
-- (SELECT ... FOR UPDATE) in a second statement: a row deleted after the
-- insert saw it, or while the lock waited for the sweep's transaction, was
-- skipped by the lock, and the call went on holding nothing, counting and
-- admitting beside any other call on the key (two holders on a cap of 1).
-- It is replaced, keeping its signature, by one statement, INSERT ... ON
-- CONFLICT DO UPDATE, which ends holding every row: the one it inserted,
-- or the one it found and locked (a row that the WHERE of DO UPDATE
-- leaves unchanged, as its WHERE false leaves every row, is locked all the
-- same); a row deleted under it is inserted again. Its lock (FOR NO KEY
-- UPDATE's) excludes its own and FOR UPDATE (inflight_trylock's, the
-- sweep's). The rows are taken in the keys' order, new ones and old ones
-- alike, so that calls on several keys cannot deadlock. A call that meets
-- a row another call holds waits for that call, as before.
--
-- The sweep's state is in tables of its own rather than in columns of
-- inflight_key and inflight_fleet: adding a column waits for every call
-- under way on the table, and a call holds inflight_key from its first
-- statement on, however long it waits for a key's row. The new tables are
-- granted to whoever may use inflight_key, as it is granted: a schema that
-- its owner migrates, for roles granted the tables there were, must not
-- have its renewals refused. No index is added on a column that is
-- updated: the sweeper's row is updated in place (HOT), and a mark is
-- inserted and deleted, not moved. This revision can be made again over
-- itself: it only adds what is missing and replaces functions.

-- A fleet's sweeper: when it last swept (ms), and the last key it looked
-- at (NULL: the next sweep starts from the first).
CREATE TABLE IF NOT EXISTS inflight_sweeper (
	fleet text PRIMARY KEY,
	swept bigint,
	after text
);

-- A key that a sweep found with nothing on it, since when (ms).
CREATE TABLE IF NOT EXISTS inflight_idle (
	fleet text NOT NULL,
	key text NOT NULL,
	since bigint NOT NULL,
	PRIMARY KEY (fleet, key)
);

-- Granted to the roles inflight_key is granted to (see above), its owner
-- among them (the role that made the schema, when another role migrates
-- it), as inflight_key's privileges are: the sweep of a role without
-- DELETE on inflight_key does nothing (see inflight_sweep_keys).
DO $$
DECLARE
	g record;
BEGIN
	FOR g IN SELECT DISTINCT a.grantee, a.privilege_type FROM pg_class c,
		aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
		WHERE c.oid = 'inflight_key'::regclass AND a.grantee <> (SELECT oid FROM pg_roles WHERE rolname = current_user) LOOP
		EXECUTE format('GRANT %s ON inflight_sweeper, inflight_idle TO %s', g.privilege_type,
			CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
	END LOOP;
END $$;

-- inflight_lock locks the rows of keys (making the missing ones), in
-- their order, so that calls on the same keys wait for each other and
-- calls on several keys cannot deadlock. It never returns without every
-- row locked: see above.
CREATE OR REPLACE FUNCTION inflight_lock(f text, keys text[]) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	-- DISTINCT: a key twice in keys (a carried pair's) would be a second
	-- change of one row, which ON CONFLICT DO UPDATE refuses.
	INSERT INTO inflight_key AS x (fleet, key)
		SELECT DISTINCT f, k FROM unnest(keys) k ORDER BY k
		ON CONFLICT (fleet, key) DO UPDATE SET seq = x.seq WHERE false;
END $$;

-- inflight_vacant reports whether nothing lives on key k: no lease, no
-- ticket, no flow. Read under the key's lock, it stays so until the
-- caller commits. PL/pgSQL, whose plans a connection keeps (plans.sql).
CREATE OR REPLACE FUNCTION inflight_vacant(f text, k text) RETURNS bool LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_variable
BEGIN
	RETURN NOT EXISTS (SELECT 1 FROM inflight_lease x WHERE x.fleet = f AND x.key = k)
		AND NOT EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = k)
		AND NOT EXISTS (SELECT 1 FROM inflight_flow x WHERE x.fleet = f AND x.key = k);
END $$;

-- inflight_sweep marks the fleet's keys that nothing lives on, and
-- deletes the rows of those marked ten minutes before (see above), at
-- now, at most once a second and 256 keys at a time, never waiting for a
-- lock.
CREATE OR REPLACE FUNCTION inflight_sweep(f text, now bigint) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	idle_for bigint := 600000; -- ms
	every bigint := 1000; -- ms between sweeps
	batch int := 256;
	s inflight_sweeper;
	seen int;
	last text;
	used text[];
	fresh text[];
	due text[];
BEGIN
	-- Read first without a lock: most renewals find the sweep not due. A
	-- sweep in the future (a clock stepped back) is due.
	SELECT * INTO s FROM inflight_sweeper x WHERE x.fleet = f;
	IF NOT FOUND THEN
		INSERT INTO inflight_sweeper (fleet) VALUES (f) ON CONFLICT DO NOTHING;
		RETURN; -- the next renewal sweeps
	END IF;
	IF s.swept > now - every AND s.swept <= now THEN
		RETURN;
	END IF;
	SELECT * INTO s FROM inflight_sweeper x WHERE x.fleet = f
		AND (x.swept IS NULL OR x.swept <= now - every OR x.swept > now) FOR UPDATE SKIP LOCKED;
	IF NOT FOUND THEN
		RETURN; -- another call sweeps
	END IF;
	-- The keys after the last one looked at (from '', which every text
	-- sorts at or after), with their marks.
	SELECT count(*), max(y.key),
		array_agg(y.key) FILTER (WHERE NOT y.vacant AND y.since IS NOT NULL),
		array_agg(y.key) FILTER (WHERE y.vacant AND (y.since IS NULL OR y.since > now)),
		array_agg(y.key) FILTER (WHERE y.vacant AND y.since <= now - idle_for)
		INTO seen, last, used, fresh, due
		FROM (SELECT x.key, i.since, inflight_vacant(f, x.key) AS vacant FROM inflight_key x
			LEFT JOIN inflight_idle i ON i.fleet = x.fleet AND i.key = x.key
			WHERE x.fleet = f AND x.key >= coalesce(s.after, '') AND (s.after IS NULL OR x.key <> s.after)
			ORDER BY x.key LIMIT batch) y;
	DELETE FROM inflight_idle x WHERE x.fleet = f AND x.key = ANY (used);
	INSERT INTO inflight_idle AS x (fleet, key, since) SELECT f, k, now FROM unnest(fresh) k
		ON CONFLICT (fleet, key) DO UPDATE SET since = EXCLUDED.since;
	-- The rows to delete, locked if no other call holds them; then, in
	-- statements of their own, which see what every call that held a row
	-- before committed, each is deleted if still idle, and its mark with
	-- it (one found in use starts its ten minutes again).
	SELECT array_agg(y.key) INTO due
		FROM (SELECT x.key FROM inflight_key x WHERE x.fleet = f AND x.key = ANY (due) FOR UPDATE SKIP LOCKED) y;
	DELETE FROM inflight_key x WHERE x.fleet = f AND x.key = ANY (due) AND inflight_vacant(f, x.key);
	DELETE FROM inflight_idle x WHERE x.fleet = f AND x.key = ANY (due);
	UPDATE inflight_sweeper x SET swept = now, after = CASE WHEN seen < batch THEN NULL ELSE last END WHERE x.fleet = f;
END $$;

-- inflight_sweep_keys sweeps f's keys' rows now, if a sweep is due (see
-- above), committing asynchronously (a sweep lost in a crash is the next
-- one's to do). A role that may not read the sweep's tables, or delete
-- keys' rows, sweeps nothing (and the server's log says so), and so does
-- a transaction not at READ COMMITTED, whose snapshot would not see what
-- the calls that held a row committed.
CREATE OR REPLACE FUNCTION inflight_sweep_keys(f text) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RETURN;
	END IF;
	PERFORM set_config('synchronous_commit', 'off', true);
	PERFORM inflight_sweep(f, inflight_now_us() / 1000);
EXCEPTION WHEN insufficient_privilege THEN
	RAISE WARNING 'inflight: keys'' rows of fleet % not swept: %', f, SQLERRM;
END $$;
