-- Schema version 1, revision 5 (see migrate.go): the small functions
-- that the calls run are PL/pgSQL, whose plans a connection keeps.
--
-- Before it they were SQL functions. PostgreSQL inlines an SQL function
-- only when its body is a bare expression (as inflight_now_us's and
-- inflight_channel's are), and up to version 17 it plans the body of one
-- it cannot inline anew in every statement that calls it: so in every
-- transaction, and every call of the store is a transaction of its own.
-- In the demo's moving-cap run on a fleet of three gateways (24 s,
-- pg_stat_user_functions), four of them took 11.4 s of self time, more
-- than inflight_admit (3.7 s) and inflight_still_queued (4.7 s) together.
-- With this revision a queued waiter's ask takes 173 us at the median
-- where it took 472 us (BenchmarkAsks, one caller, PostgreSQL 15).
-- PostgreSQL 18 keeps SQL functions' plans as well (not measured here).
--
-- It replaces inflight_current, inflight_earliest, inflight_queued,
-- inflight_dead, inflight_alive and inflight_abandoned with the same
-- signatures, bodies and answers: a process of an earlier release calls
-- them as before.

CREATE OR REPLACE FUNCTION inflight_current(f text, known bigint, pause bigint, ttl bigint, now bigint) RETURNS bool LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_variable
BEGIN
	RETURN EXISTS (SELECT 1 FROM inflight_fleet x WHERE x.fleet = f AND x.epoch = known
		AND EXISTS (SELECT 1 FROM inflight_marker m WHERE m.fleet = f AND m.epoch = known)
		AND x.pause_until <= now AND (pause <= 0 OR x.last_pause >= pause AND x.last_ttl >= ttl));
END $$;

CREATE OR REPLACE FUNCTION inflight_earliest(f text, k text, now bigint) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_variable
BEGIN
	RETURN (SELECT coalesce(min(x.expires), 0) FROM inflight_lease x WHERE x.fleet = f AND x.key = k AND x.expires > now);
END $$;

CREATE OR REPLACE FUNCTION inflight_queued(f text, k text, now bigint) RETURNS int LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_variable
BEGIN
	RETURN (SELECT count(*)::int FROM inflight_ticket x WHERE x.fleet = f AND x.key = k);
END $$;

CREATE OR REPLACE FUNCTION inflight_dead(f text, p text, now bigint, claim bigint) RETURNS bool LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	RETURN coalesce((SELECT x.alive_until <= now + 1.5 * claim FROM inflight_proc x WHERE x.fleet = f AND x.proc = p), true);
END $$;

CREATE OR REPLACE FUNCTION inflight_alive(f text, p text, now bigint, ms bigint) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	INSERT INTO inflight_proc AS x (fleet, proc, alive_until) VALUES (f, p, now + ms)
		ON CONFLICT (fleet, proc) DO UPDATE SET alive_until = EXCLUDED.alive_until;
END $$;

CREATE OR REPLACE FUNCTION inflight_abandoned(f text, l text, now bigint) RETURNS bool LANGUAGE plpgsql AS $$
#variable_conflict use_variable
BEGIN
	RETURN EXISTS (SELECT 1 FROM inflight_tomb x WHERE x.fleet = f AND x.lease = l AND x.until > now);
END $$;
