-- Schema version 1, revision 12 (see migrate.go): a lease's TTL runs only
-- while the store is heard (driver.Store).
--
-- The fleet's row keeps heard: the database's clock (ms) when a call that
-- carries a TTL last ran (an admission, a waiter's ask or claim, a
-- renewal, a release or an abandon), kept up to ttl/16 coarse, so that it
-- is written once in that step rather than by every call, and only
-- forward: a call whose clock is behind heard (read before another call's,
-- and stalled since) leaves it, unless it is more than a TTL behind (a
-- clock stepped back far: then heard is its now). A call with a TTL that
-- finds more than ttl/2 since heard finds a silence: the server hung
-- (SIGSTOP, a stalled disk), or every process was cut off from it or
-- stopped, and the live holders could not renew. Before it deletes an
-- expired lease, serves a queue or admits, it makes every lease that had
-- not expired at heard, of any key, last until now + ttl: the holders
-- renew once they reach the store, and no newcomer takes their room
-- before. Before it, a newcomer's admission that came first after a hang
-- past the TTL deleted the holder's lease as expired and was admitted:
-- two holders on a key capped at 1.
--
-- Graces that follow one another hold a lease that its holder does not
-- extend five minutes at most, as Redis's do. The fleet's row keeps the
-- latest grace's start (grace_from) and end (grace_until, the latest
-- expiry it made); a silence that began inside it (heard before
-- grace_until: the holders it held may not have been heard since) counts
-- from grace_from. A lease a grace moves is marked (inflight_lease.graced)
-- until its holder extends it: within five minutes of grace_from, a
-- silence moves every lease that had not expired at heard, marked or not;
-- past them, only those not marked (it marks them), and grace_from stays,
-- so that graces keep past the bound until a silence begins outside one.
-- So a dead holder's lease (never extended: it stays marked) is held
-- through one chain of graces, five minutes and a TTL at most, while a
-- live holder that renewed since (renewals move heard forward, but it
-- stays before grace_until for up to a TTL: "inside a grace" does not
-- mean unheard) is held by every silence. Before the mark, a silence past
-- the bound moved nothing, and a holder that renewed during a grace and
-- was then caught by a hang past TTL/2 was dropped and a newcomer admitted
-- over it. (Starting the bound afresh from heard instead would hold a
-- dead holder's lease forever: the next silence, within five minutes of
-- the new start, would move the marked lease again.) Past the bound, a
-- chain lasts while the store keeps falling silent within a TTL of the
-- last grace (a flapping server), however long: meanwhile a live holder
-- is held only if it renewed between two silences (its breaker's probe
-- renews within 250 ms of the store answering, by default). A silence of its own
-- is honoured however long. Without the bound, processes that never live
-- through a renewal round (cron jobs, command-line tools), calling every
-- ttl/2 to ttl, would find a silence each time and hold a dead holder's
-- lease forever. A grace ends with the expiries it made, so a silence
-- after it counts afresh, from heard, and moves every lease.
--
-- The mark is cleared (graced = false) by every write by which a holder
-- extends or takes its own lease: a renewal (its put back is a new row),
-- the admission of its holder again, of a waiter taking its room or of a
-- newcomer's lease met there, a claim, a carried pair put back, all in
-- the functions replaced here. A grant (inflight_grant, units.sql's,
-- replaced here) is a new row, unmarked; one that extends a lease its
-- ticket holds already (put back) clears it too, as a new grant would
-- be: its waiter's process is alive (serving drops a dead one's), and
-- claims it or lets it expire. One that finds a later expiry leaves the
-- mark, as it leaves the expiry.
--
-- No call shortens a live lease: wherever one is extended (a renewal, the
-- admission of its holder again or of a waiter taking its room, a claim, a
-- carried pair put back) a later expiry it finds stays. A call reads its
-- clock after its keys' locks, and may stall after (a hang, a process
-- descheduled): a call on other keys that finds the silence meanwhile
-- moves the lease past the stalled call's now + ttl, and writing that over
-- it would undo the grace, the lease already expired then: the next
-- newcomer on its key would delete it and be admitted over a holder told
-- it renewed. So inflight_admit and inflight_renew (units.sql's) are
-- replaced here, keeping their signatures, and inflight_claim (and
-- inflight_grant, for the mark). (The cost: a lease renewed with a TTL
-- shorter than before keeps the longer expiry until it passes.)
--
-- The check runs in inflight_epoch (replaced), which every call with a
-- TTL runs first under its keys' locks, with the clock it then works by:
-- inflight_admit and inflight_renew pass it their TTL, and the releases
-- and abandons pass theirs through inflight_freeing, a new signature with
-- ttl (the previous one stays, passing none). inflight_release gets a
-- signature with ttl (driver.ReleaseCall.TTL); the previous one, which
-- the release before calls, finds no silence. inflight_abandon keeps its
-- signature and passes its ttl. The waiter's calls answered without the
-- keys' locks (inflight_still_queued, inflight_claim, replaced) write
-- heard too, and take the whole path when they find a silence. And
-- inflight_admit_passing (newcomer.sql's, replaced) applies the silence
-- under the keys' locks before it reads the caller's lease's expiry: a
-- lease the grace keeps is claimed, not taken by a newcomer counted
-- against the heavy waiter it passes.
--
-- Locks: the silence is read without a lock. Only a call that finds one
-- locks the fleet's row (after its keys' rows, as inflight_epoch's other
-- writes of the fleet's row do) and reads heard and the grace again under
-- it: of calls that find it at once, one makes the leases last and writes
-- heard, and the others find heard fresh. A write of heard alone never
-- waits: it skips the row when another call holds it (that one is writing
-- it, or will be, at about the same time). The check runs after the
-- call's keys' locks, not before: its clock must be the one the call then
-- deletes expired leases by (read after the locks' wait, which a hang may
-- stretch). The leases it makes last are of any key: it waits for a lease
-- row another call holds (a call that found no silence, so one whose
-- clock came more than ttl/2 - ttl/16 before, across a hang: once it
-- commits, the expiry it wrote is moved, and a call that reaches the row
-- after keeps the later expiry, see above), and PostgreSQL breaks the
-- deadlock, failing one of the two calls whole, if that call then waits
-- for a lease row this one has updated.
--
-- This revision can be made again over itself: it only adds what is
-- missing and replaces functions.

ALTER TABLE inflight_fleet ADD COLUMN IF NOT EXISTS heard bigint;
ALTER TABLE inflight_fleet ADD COLUMN IF NOT EXISTS grace_from bigint;
ALTER TABLE inflight_fleet ADD COLUMN IF NOT EXISTS grace_until bigint;
-- A constant default: no rewrite of the table (PostgreSQL 11 and later).
ALTER TABLE inflight_lease ADD COLUMN IF NOT EXISTS graced bool NOT NULL DEFAULT false;

-- inflight_heard applies the silence of a call with ttl (ms; 0 or less:
-- the call finds none and writes nothing) at now: if heard is more than
-- ttl/2 before now, every lease of the fleet that had not expired at heard
-- lasts until now + ttl, and is marked (graced); if the silence began
-- inside a grace that started more than five minutes ago, only the leases
-- not marked (see above). Then heard is now (with rewrite; without it, it
-- returns false and changes nothing, for a call answered without the
-- keys' locks to take the whole path). Else it writes heard if it is
-- missing, more than ttl/16 before now, or more than ttl after now (a
-- clock stepped back far; one stepped back less, or a call whose clock is
-- stale, finds no silence and leaves heard), and returns true.
CREATE OR REPLACE FUNCTION inflight_heard(f text, now bigint, ttl bigint, rewrite bool) RETURNS bool LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	keep_graces bigint := 300000; -- ms: graces that follow one another hold a lease not extended this long at most
	h bigint;
	gf bigint;
	gu bigint;
	start bigint;
	marked bool := true; -- the leases a grace moved are moved too
BEGIN
	IF coalesce(ttl, 0) <= 0 THEN
		RETURN true;
	END IF;
	SELECT x.heard INTO h FROM inflight_fleet x WHERE x.fleet = f;
	IF NOT FOUND THEN
		RETURN true; -- no fleet yet (inflight_epoch makes its row first)
	END IF;
	IF now - h > ttl / 2 THEN
		IF NOT rewrite THEN
			RETURN false;
		END IF;
		SELECT x.heard, x.grace_from, x.grace_until INTO h, gf, gu FROM inflight_fleet x WHERE x.fleet = f FOR UPDATE;
		IF now - h > ttl / 2 THEN
			start := h;
			IF gu > h THEN -- begun inside the latest grace: counted from its start
				start := least(gf, h);
				-- Graces in a row for too long: only the leases their
				-- holders extended since a grace moved them.
				marked := now - gf <= keep_graces;
			END IF;
			-- Unindexed columns: HOT updates, as renewals are.
			UPDATE inflight_lease x SET expires = now + ttl, graced = true
				WHERE x.fleet = f AND x.expires > h AND x.expires < now + ttl AND (marked OR NOT x.graced);
			UPDATE inflight_fleet x SET heard = now, grace_from = start, grace_until = greatest(gu, now + ttl) WHERE x.fleet = f;
			RETURN true;
		END IF;
	END IF;
	IF h IS NULL OR now - h > ttl / 16 OR h > now + ttl THEN
		UPDATE inflight_fleet x SET heard = now WHERE x.fleet IN (SELECT y.fleet FROM inflight_fleet y
			WHERE y.fleet = f AND (y.heard IS NULL OR now - y.heard > ttl / 16 OR y.heard > now + ttl) FOR UPDATE SKIP LOCKED);
	END IF;
	RETURN true;
END $$;

-- inflight_epoch (see schema.sql), applying the silence of a call with
-- ttl (inflight_heard) once it has the fleet's row.
CREATE OR REPLACE FUNCTION inflight_epoch(f text, now bigint, now_us bigint, known bigint, pause bigint, ttl bigint,
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
	PERFORM inflight_heard(f, now, ttl, true);
END $$;

-- inflight_freeing (see schema.sql) for a call with ttl, whose silence
-- it applies (through inflight_epoch) before the call frees or serves
-- anything. The signature without ttl stays, for the release before.
CREATE OR REPLACE FUNCTION inflight_freeing(f text, keys text[], async bool, ttl bigint, OUT now bigint, OUT serving bool)
	LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now_us bigint;
BEGIN
	PERFORM inflight_begin(async);
	PERFORM inflight_lock(f, keys);
	now_us := inflight_now_us();
	now := now_us / 1000;
	PERFORM inflight_epoch(f, now, now_us, 0, 0, ttl);
	serving := NOT EXISTS (SELECT 1 FROM inflight_fleet x WHERE x.fleet = f AND x.pause_until > now);
END $$;

-- inflight_release (see release.sql) of a call with ttl
-- (driver.ReleaseCall.TTL).
CREATE OR REPLACE FUNCTION inflight_release(f text, claim bigint, keys text[], leases text[], limits bigint[], async bool, ttl bigint)
	RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now bigint;
	serving bool;
	k text;
	lim bigint;
	n int;
	r int;
BEGIN
	SELECT * INTO now, serving FROM inflight_freeing(f, keys, async, ttl);
	FOR i IN 1..coalesce(array_length(keys, 1), 0) LOOP
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.lease = leases[i];
	END LOOP;
	IF NOT serving THEN
		RETURN;
	END IF;
	FOR k, lim, n IN SELECT p.key, min(p.lim), count(*) FROM unnest(keys, limits) WITH ORDINALITY AS p(key, lim, i)
			GROUP BY p.key ORDER BY min(p.i) LOOP
		r := inflight_serve(f, k, lim, now, claim, 0);
		WHILE r > 0 AND n > 1 LOOP
			r := inflight_serve(f, k, lim, now, claim, r - 1);
			n := n - 1;
		END LOOP;
	END LOOP;
END $$;

-- inflight_release as the release before calls it: without a TTL, it
-- finds no silence.
CREATE OR REPLACE FUNCTION inflight_release(f text, claim bigint, keys text[], leases text[], limits bigint[], async bool)
	RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	PERFORM inflight_release(f, claim, keys, leases, limits, async, 0::bigint);
END $$;

-- inflight_abandon (see schema.sql), applying the silence of its ttl.
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

-- inflight_still_queued (see pass.sql), which takes the whole path where
-- it finds a silence, and writes heard once it answers: only then, so that
-- a call that goes on to the whole path holds no lock of the fleet's row
-- while it waits for its keys'.
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
	IF NOT inflight_heard(f, now, ttl, false) THEN
		RETURN NULL; -- a silence: the whole path makes the leases last
	END IF;
	UPDATE inflight_ticket x SET expires = now + 3 * ttl, limits = inflight_still_queued.limits
		WHERE (x.fleet, x.key, x.ticket) IN (SELECT y.fleet, y.key, y.ticket FROM inflight_ticket y
			WHERE y.fleet = f AND y.key = ANY (keys) AND y.ticket = l FOR UPDATE SKIP LOCKED);
	UPDATE inflight_proc x SET alive_until = greatest(x.alive_until, now + live)
		WHERE (x.fleet, x.proc) IN (SELECT y.fleet, y.proc FROM inflight_proc y WHERE y.fleet = f AND y.proc = p FOR UPDATE SKIP LOCKED);
	RETURN ARRAY[3, 1, inflight_units(f, keys[1], now), inflight_earliest(f, keys[1], now), now, known, inflight_queued(f, keys[1], now)];
END $$;

-- inflight_claim (see asks.sql), which takes the whole path where it
-- finds a silence, writes heard (never waiting) once it claims, and keeps
-- a later expiry it finds on the lease's rows.
CREATE OR REPLACE FUNCTION inflight_claim(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint, known bigint,
	pause bigint, starts bool, async bool) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	n int := array_length(keys, 1);
	now_us bigint;
	now bigint;
BEGIN
	IF known <= 0 OR NOT EXISTS (SELECT 1 FROM inflight_lease x WHERE x.fleet = f AND x.key = ANY (keys) AND x.lease = l) THEN
		RETURN NULL; -- a newcomer, or a waiter not granted yet
	END IF;
	PERFORM inflight_begin(async);
	BEGIN
		-- Never waits: a row another call holds sends the claim through
		-- the whole path.
		PERFORM 1 FROM inflight_lease x WHERE x.fleet = f AND x.key = ANY (keys) AND x.lease = l ORDER BY x.key FOR UPDATE NOWAIT;
		now_us := inflight_now_us();
		now := now_us / 1000;
		IF not_after > 0 AND now > not_after THEN
			RETURN ARRAY[-2, 0, 0, 0, now, 0, 0];
		END IF;
		IF NOT inflight_current(f, known, pause, ttl, now)
			OR (SELECT count(*) FROM inflight_lease x WHERE x.fleet = f AND x.key = ANY (keys) AND x.lease = l AND x.expires > now) <> n
			OR inflight_abandoned(f, l, now)
			OR EXISTS (SELECT 1 FROM unnest(keys, limits) AS k(key, lim) WHERE inflight_units(f, k.key, now) > k.lim)
			OR NOT inflight_heard(f, now, ttl, false) THEN
			RAISE EXCEPTION USING ERRCODE = 'IF003'; -- the whole path's, with the rows let go
		END IF;
		UPDATE inflight_lease x SET expires = greatest(x.expires, now + ttl), granted = false, graced = false
			WHERE x.fleet = f AND x.key = ANY (keys) AND x.lease = l;
	EXCEPTION WHEN lock_not_available OR SQLSTATE 'IF003' THEN
		RETURN NULL;
	END;
	RETURN inflight_admitted(f, keys, n, starts, now, now_us, known, not_after);
END $$;

-- inflight_grant (units.sql's), which unmarks a lease its ticket holds
-- already (put back) where it extends it: a grant is a new lease, of a
-- waiter whose process serving found alive. The rest is units.sql's: it
-- gives ticket t, of units, a lease of the claim window on each of its
-- keys, weighing its units, takes it out of their queues (moving each
-- class's virtual time to its start tag there, and dropping the finish
-- tags that passes), and wakes its process. The signature without units
-- stays units.sql's call of this one.
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
		-- weighs what it weighs; extended, it is unmarked, as a new grant.
		INSERT INTO inflight_lease AS x (fleet, key, lease, expires, granted, units) VALUES (f, k, t, now + claim, true, units)
			ON CONFLICT (fleet, key, lease) DO UPDATE SET expires = greatest(x.expires, EXCLUDED.expires),
				graced = x.graced AND x.expires >= EXCLUDED.expires;
	END LOOP;
	PERFORM pg_notify(inflight_channel(f, p), t);
END $$;

-- inflight_admit (units.sql's), which never shortens a lease: the
-- holder's call made again, a waiter taking its room, and a newcomer's
-- lease met there keep a later expiry they find (a silence's, applied by
-- a call on other keys while this one stalled after reading its clock),
-- as a carried pair put back did already. The rest is units.sql's: it
-- returns {status, index of the key (1-based; 0: none), its count in
-- units, its earliest expiry (the pause's end if paused; the start in
-- microseconds for an admission with starts), now, epoch, queue length},
-- then, for an admission with starts, each key's units held. The
-- signature without units stays units.sql's call of this one.
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

-- inflight_renew (units.sql's), which never shortens a lease: a renewal
-- whose clock was read before a hang keeps the later expiry that a
-- silence found meanwhile gave the lease. The rest is units.sql's: leases
-- come as parallel arrays; each lease's keys and limits are the next
-- nkeys[i] of keys and limits, and units[i] what it weighs where it is
-- put back (0 or NULL: 1). It returns {epoch, now, each lease's fate}, or
-- {-2, now} past not_after. The signature without units stays units.sql's
-- call of this one.
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
			UPDATE inflight_lease x SET expires = greatest(x.expires, now + ttl), graced = false
				WHERE x.fleet = f AND x.key = ks[j] AND x.lease = leases[i] AND x.expires > now;
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

-- inflight_admit_passing (newcomer.sql's), which applies the silence
-- (inflight_heard, as inflight_admit's inflight_epoch would) under the
-- keys' locks before it reads the expiry of the caller's stored lease: a
-- lease that expired in the silence, and that the grace keeps, is the
-- caller's claim, not a newcomer's lease counted against the heavy waiter
-- it passes. Read before, it was taken for expired.
CREATE OR REPLACE FUNCTION inflight_admit_passing(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint, known bigint,
	pause bigint, wait bool, starts bool, claim bigint, r smallint, fl text, weight int, p text, max_q int, max_f int,
	live bigint, async bool, carried_keys text[], carried_leases text[], units int, carried_units int[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	res bigint[];
	newcomer bool := false;
	e bigint; -- the expiry of the caller's stored lease on keys[1] (NULL: none)
	now bigint;
	b inflight_ticket;
BEGIN
	-- Only a key with a weighted waiter (one probe of their index) may
	-- have a heavy waiter to pass: elsewhere the call is inflight_admit's.
	-- One that comes meanwhile keeps the room from this call, as a
	-- process of an earlier release's.
	IF wait AND array_length(keys, 1) = 1
		AND EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[1] AND x.units > 1) THEN
		newcomer := NOT EXISTS (SELECT 1 FROM inflight_ticket x WHERE x.fleet = f AND x.key = keys[1] AND x.ticket = l);
		IF newcomer AND EXISTS (SELECT 1 FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[1] AND x.lease = l) THEN
			-- The keys inflight_admit locks, in its order (it takes them
			-- again at no cost), after its check of the isolation level.
			PERFORM inflight_begin(async);
			PERFORM inflight_lock(f, keys || coalesce(carried_keys, '{}'));
			-- The silence first, as inflight_admit applies it (its clock, a
			-- little later, then finds heard fresh): a lease the grace
			-- keeps is the caller's to claim. Not past not_after, where
			-- inflight_admit changes nothing.
			now := inflight_now_us() / 1000;
			IF not_after <= 0 OR now <= not_after THEN
				PERFORM inflight_heard(f, now, ttl, true);
			END IF;
			SELECT x.expires INTO e FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[1] AND x.lease = l;
		END IF;
		PERFORM set_config('inflight.pass', 'on', true);
	END IF;
	res := inflight_admit(f, l, keys, limits, ttl, not_after, known, pause, wait, starts, claim, r, fl, weight, p,
		max_q, max_f, live, async, carried_keys, carried_leases, units, carried_units);
	-- res[5] is inflight_admit's clock: a lease expired then made no claim.
	IF res[1] = 1 AND newcomer AND (e IS NULL OR e <= res[5]) THEN
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
