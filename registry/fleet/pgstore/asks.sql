-- Schema version 1, revision 3 (see migrate.go): a waiter that asks again
-- behind a heavy waiter, and one that claims its grant, are answered
-- without the keys' locks.
--
-- Before it, a waiter whose units fit a key's count took inflight_admit's
-- whole path, locking the key, even when the head of the key's queue was a
-- heavy waiter that keeps the room (driver.ReleaseCall). When many light
-- requests wait behind a heavy one, as when prompts of 500,000 tokens are
-- sent among small ones, every ask of every light waiter then queued for
-- the key's row behind the others and the releases: 1,008 such requests
-- over three processes took 10 to 21 s to serve, and calls passed a 5 s
-- timeout. And each waiter granted by a release's serving claimed its
-- grant on that path too, behind every call on its keys, though a claim
-- adds nothing to any count.
--
-- It replaces inflight_still_queued, with the same signature, and adds
-- inflight_claim, which this release calls before inflight_admit, and
-- inflight_current, the check of the fleet's epoch both make.

-- inflight_current reports whether known is the fleet's epoch (its
-- marker there: no data lost since), with no pause of new admissions at
-- now and the callers' settings (pause, ttl) known to it: what a call
-- answered without the keys' locks needs, inflight_epoch's whole work
-- being due otherwise.
CREATE OR REPLACE FUNCTION inflight_current(f text, known bigint, pause bigint, ttl bigint, now bigint) RETURNS bool LANGUAGE sql STABLE AS $$
	SELECT EXISTS (SELECT 1 FROM inflight_fleet x WHERE x.fleet = f AND x.epoch = known
		AND EXISTS (SELECT 1 FROM inflight_marker m WHERE m.fleet = f AND m.epoch = known)
		AND x.pause_until <= now AND (pause <= 0 OR x.last_pause >= pause AND x.last_ttl >= ttl))
$$;

-- inflight_still_queued answers a ticket that asks again while it is
-- queued on each of its keys and none has room for it, without locking
-- the keys: most of a full key's calls are its waiters asking, and each
-- would otherwise wait for the key's row behind the releases that serve
-- them. It renews the ticket and its process, skipping a row another call
-- holds (the next ask renews it; that call may be serving the ticket), and
-- returns what inflight_admit would. A key has no room for the ticket when
-- its units do not fit the count, or when the head of its queue is
-- another ticket that serving the key would stop at, as inflight_serve
-- judges it under the caller's limit: its units fit the limit but not the
-- count, its ticket has not expired and its process is not dead. (Its
-- process is judged alive while its liveness deadline is more than half
-- the caller's liveness window away: a caller's Live is at least three
-- Claim windows (driver.AdmitCall), so that is past the 1.5 claim windows
-- by which inflight_dead judges a process dead.) The head cannot be the
-- caller: the key has room for the caller's units. It returns NULL, for
-- inflight_admit's whole path, when anything else may be due: a key with
-- room for it (a lease expired, a raised limit, a head that may be served
-- or dropped), the ticket granted, abandoned or not queued on every key,
-- its process not known alive, an epoch other than the caller's, a pause
-- or its settings. A release committed after its reads serves the queue
-- itself.
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

-- (Replaced by silence.sql, revision 12: it writes heard.)
-- inflight_claim answers a waiter's call that claims its grant (a lease
-- of it on each of its keys, made by a release that served the queue, or
-- held already) without locking the keys: a grant counts on each key from
-- the moment it is made, so taking it adds nothing to any count, and the
-- keys' rows are left to the calls that do. It locks the lease's rows if
-- no other call holds them (then reads the clock), extends them to the
-- lease TTL and marks them claimed, and returns what inflight_admit would.
-- It returns NULL, for inflight_admit's whole path (which a caller
-- without a lease meets at the cost of one probe of each key's leases),
-- unless every key holds the lease unexpired with its count within the
-- caller's limit (a grant made under a limit lowered since is given back
-- there), the lease is not abandoned, and the epoch is the caller's, with
-- no pause and its settings known. Before it does, it lets the lease's
-- rows go (their locks are a subtransaction's, rolled back): the whole
-- path locks the keys first, as every call does, and a call that holds a
-- key may be waiting for those rows (to delete an expired grant, say).
-- Past not_after it answers as the whole path would, having changed
-- nothing.
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
			OR EXISTS (SELECT 1 FROM unnest(keys, limits) AS k(key, lim) WHERE inflight_units(f, k.key, now) > k.lim) THEN
			RAISE EXCEPTION USING ERRCODE = 'IF003'; -- the whole path's, with the rows let go
		END IF;
		UPDATE inflight_lease x SET expires = now + ttl, granted = false WHERE x.fleet = f AND x.key = ANY (keys) AND x.lease = l;
	EXCEPTION WHEN lock_not_available OR SQLSTATE 'IF003' THEN
		RETURN NULL;
	END;
	RETURN inflight_admitted(f, keys, n, starts, now, now_us, known, not_after);
END $$;
