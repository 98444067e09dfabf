-- Schema version 1, revision 4 (see migrate.go): flows take turns counted
-- in units.
--
-- Before it, a waiter moved its flow's next start tag on by 1/weight
-- whatever it weighed, so a flow of requests of 500,000 tokens was granted
-- as many requests as a flow of requests of 1,000: a hundred times its
-- part of the tokens. Now a waiter of u units moves it on by u/weight, as
-- the local queues and the Redis store count turns, up to {{maxTag}}
-- (driver.MaxTag): tags start from 0 when a key's queue empties, and a
-- backlog that passes it is served by arrival until it does.
--
-- It replaces inflight_enqueue, with the same signature. A process of an
-- earlier release calls it too: turns are counted alike across the fleet
-- from the migration on.

-- inflight_enqueue queues ticket t, of units, on each of its keys,
-- numbering its arrival in the fleet's order. A flow's start tag in a
-- class is its finish tag there or the class's virtual time, whichever is
-- later, and its next finish tag is that plus units/weight; its place
-- sorts by the tag to the microunit (as Redis's queue sorts), so that
-- turns of flows that meet, 1/3+1/3+1/3 against 1, go by arrival.
CREATE OR REPLACE FUNCTION inflight_enqueue(f text, keys text[], limits bigint[], t text, r smallint, fl text, weight int, p text,
	now bigint, ttl bigint, units int) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	arrival bigint := nextval('inflight_arrival');
	k text;
	v float8;
	tag float8;
	finish float8;
	s bigint;
BEGIN
	FOREACH k IN ARRAY keys LOOP
		PERFORM inflight_unqueue(f, k, t, true); -- a place left on one of its keys
		UPDATE inflight_key x SET seq = x.seq + 1 WHERE x.fleet = f AND x.key = k RETURNING x.vt[r + 1], x.seq INTO v, s;
		SELECT greatest(v, coalesce(x.finish, 0)) INTO tag FROM inflight_flow x WHERE x.fleet = f AND x.key = k AND x.rank = r AND x.flow = fl;
		IF NOT FOUND THEN
			tag := v;
		END IF;
		finish := least(tag + units::float8 / weight, {{maxTag}});
		INSERT INTO inflight_flow AS x (fleet, key, rank, flow, finish, base, n) VALUES (f, k, r, fl, finish, tag, 1)
			ON CONFLICT (fleet, key, rank, flow) DO UPDATE SET finish = EXCLUDED.finish, n = x.n + 1,
				base = CASE WHEN x.n = 0 THEN EXCLUDED.base ELSE x.base END;
		INSERT INTO inflight_ticket (fleet, key, ticket, rank, tag, seq, proc, flow, arrival, finish, keys, limits, expires, units)
			VALUES (f, k, t, r, round(tag::numeric, 6)::float8, s, p, fl, arrival, finish, keys, limits, now + 3 * ttl, units);
	END LOOP;
END $$;
