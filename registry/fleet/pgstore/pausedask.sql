-- Schema version 1, revision 15 (see migrate.go): a waiter keeps its
-- place across a pause of new admissions.
--
-- An ask of a queued ticket while new admissions are paused (after the
-- store lost its data) returned before it renewed its process's liveness
-- and its place's expiry. A pause lasts a renewal round, longer than a
-- process's liveness (5 claim windows by default), and the first serving
-- after it dropped every waiter as a dead process's: they queued again in
-- whatever order they came. inflight_admit is silence.sql's, but for that:
-- a queued ticket's ask renews both before the paused answer, as on Redis
-- and in memstore. It keeps its signature and the meaning of its answer.

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
