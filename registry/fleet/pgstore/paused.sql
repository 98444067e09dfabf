-- Schema version 1, revision 14 (see migrate.go): an urgent ticket with a
-- paused key keeps no place.
--
-- A ticket of several keys passed over {{maxPassed}} times is urgent, and
-- a key keeps a place (its units) for its oldest urgent ticket, so that it
-- is served once its other keys have room. A ticket one of whose keys has
-- a limit of 0 (paused by its process's SetLimit) cannot be served until
-- that is raised, and the place kept for it idled its other keys for the
-- whole pause: a provider key of limit 1 admitted nobody, with nothing in
-- flight. The place now goes to the oldest urgent ticket none of whose
-- keys' limits (as its process last sent them: each ask writes them) is
-- 0, as in the local registry and on Redis. inflight_room_of keeps its
-- signature and the meaning of its answer.

-- inflight_room_of is inflight_room where the caller has k's count in
-- units, c, with k's expired leases deleted.
CREATE OR REPLACE FUNCTION inflight_room_of(f text, k text, lim bigint, t text, arrival bigint, now bigint, claim bigint, c bigint)
	RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	free bigint := lim - c;
	u inflight_ticket;
BEGIN
	IF free <= 0 THEN
		RETURN free;
	END IF;
	FOR i IN 1..64 LOOP
		SELECT * INTO u FROM inflight_ticket x WHERE x.fleet = f AND x.key = k AND x.urgent
			AND NOT (0 = ANY (x.limits))
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
		AND NOT (0 = ANY (x.limits)) ORDER BY x.arrival LIMIT 1), 1);
END $$;
