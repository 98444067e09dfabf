-- Schema version 1, revision 10 (see migrate.go): a call whose lease has
-- expired is a newcomer.
--
-- inflight_admit deletes a key's expired leases before it looks for the
-- caller's, so a call made again after its lease expired (a grant not
-- claimed within its claim, or a holder that stopped renewing) is admitted
-- as a newcomer. Revision 6's inflight_admit_passing took any stored lease
-- of the caller's, expired or not, for a claim, and did not count such a
-- newcomer against the heavy waiter it passed. It is replaced with the same
-- signature and answers: it reads the stored lease's expiry under the
-- keys' locks, and after inflight_admit, a lease expired at that call's
-- clock (its reply's now) made no claim, as inflight_admit found.
--
-- Unlike the reference store, a lease not expired is taken for a claim
-- even when it is given back (its key over the call's limit) and the call
-- is admitted again at once, which needs the call to weigh fewer units
-- than the lease it made before: the fleet's client never sends that.
--
-- (Replaced by silence.sql, revision 12: it applies the silence before it
-- reads the stored lease's expiry.)

CREATE OR REPLACE FUNCTION inflight_admit_passing(f text, l text, keys text[], limits bigint[], ttl bigint, not_after bigint, known bigint,
	pause bigint, wait bool, starts bool, claim bigint, r smallint, fl text, weight int, p text, max_q int, max_f int,
	live bigint, async bool, carried_keys text[], carried_leases text[], units int, carried_units int[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	res bigint[];
	newcomer bool := false;
	e bigint; -- the expiry of the caller's stored lease on keys[1] (NULL: none)
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
